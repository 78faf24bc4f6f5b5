--[[
memplan check at job submission: a Slurm job_submit/lua plugin (slurm.conf:
JobSubmitPlugins=lua, this file installed as job_submit.lua next to slurm.conf).

A job opts in with a comment naming the model and workload:
  sbatch --partition=gpu-h100 --comment="memplan:model=llama-3.1-8b,batch=1,seq=4096" train.sh
Keys: model (a preset, required), batch, seq, world-size, dtype (fp32|bf16|fp16), lora-rank,
lora-targets (modules separated by '+', or all). The GPU comes from the job's (first)
partition through `partitions` below. The script runs `memplan --json plan` against the planner:
a job that does not fit is refused with the planner's reason; one that fits gets ",plan=PLAN_ID"
appended to its comment. Jobs without "memplan:" pass untouched. When the planner cannot be
reached the job passes (fail_open) and slurmctld logs why.

Site settings are the `config` table; a file named by the environment variable
MEMPLAN_JOB_SUBMIT_CONFIG (a Lua chunk returning a table) overrides them.
docs/operations.md, "Slurm", shows it step by step.
--]]

local config = {
  memplan = "/usr/local/bin/memplan",        -- the memplan CLI
  planner = "planner.internal:50051",         -- --planner HOST:PORT
  cli_flags = {},                             -- e.g. {"--tls-ca", "/etc/memplan/ca.crt"}
  timeout_seconds = 10,
  partitions = { ["gpu-4090"] = "rtx-4090", ["gpu-h100"] = "h100-80gb" },
  fail_open = true,                           -- planner unreachable: let the job through
}

local override_path = os.getenv("MEMPLAN_JOB_SUBMIT_CONFIG")
if override_path ~= nil and override_path ~= "" then
  for key, value in pairs(dofile(override_path)) do config[key] = value end
end

local KEYS = { model = "--arch", batch = "--batch", seq = "--seq", ["world-size"] = "--world-size",
               dtype = "--dtype", ["lora-rank"] = "--lora-rank", ["lora-targets"] = "--lora-targets" }
local KEY_NAMES = "model, batch, seq, world-size, dtype, lora-rank, lora-targets"

-- Values reach a shell: letters, digits and . _ - + only.
local function safe(value) return value:match("^[%w%._%-%+]+$") ~= nil end

local function quote(word) return "'" .. word:gsub("'", "'\\''") .. "'" end

-- "memplan:k=v,k=v" -> table of flags, or nil, error
local function parse_comment(spec)
  local flags = {}
  for pair in spec:gmatch("[^,]+") do
    local key, value = pair:match("^%s*([%w%-]+)=(.*)$")
    if key == nil then return nil, "'" .. pair .. "' is not key=value" end
    if key == "plan" then goto continue end  -- appended by an earlier submission
    if KEYS[key] == nil then
      return nil, "unknown key '" .. key .. "'; allowed: " .. KEY_NAMES
    end
    if not safe(value) then
      return nil, key .. "='" .. value .. "' has characters other than letters, digits and . _ - +"
    end
    if key == "lora-targets" then value = value:gsub("%+", ",") end
    flags[key] = value
    ::continue::
  end
  if flags.model == nil then return nil, "model=PRESET is required" end
  return flags
end

local function run(args)
  local words = {}
  for _, word in ipairs(args) do words[#words + 1] = quote(word) end
  local pipe = io.popen(table.concat(words, " ") .. " 2>&1")
  local output = pipe:read("a")
  local _, _, code = pipe:close()
  return code or 0, output
end

local function json_string(text, key)
  local value = text:match('"' .. key .. '":%s*"(.-[^\\])"')
  if value == nil then return "" end
  return (value:gsub('\\"', '"'))
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local comment = job_desc.comment
  if comment == nil or comment:sub(1, 8) ~= "memplan:" then return slurm.SUCCESS end
  local flags, err = parse_comment(comment:sub(9))
  if flags == nil then
    slurm.log_user("memplan: --comment: %s", err)
    return slurm.ERROR
  end
  local partition = (job_desc.partition or config.default_partition or ""):match("^[^,]*")
  local gpu = config.partitions[partition]
  if gpu == nil then
    local known = {}
    for name in pairs(config.partitions) do known[#known + 1] = name end
    table.sort(known)
    slurm.log_user("memplan: partition '%s' has no GPU preset in job_submit.lua; known: %s",
                   partition, table.concat(known, ", "))
    return slurm.ERROR
  end
  local args = { config.memplan, "--planner", config.planner, "--timeout",
                 tostring(config.timeout_seconds), "--json" }
  for _, flag in ipairs(config.cli_flags) do args[#args + 1] = flag end
  for _, word in ipairs({ "plan", "--gpu", gpu, "--skip-limits", "--max-alternatives", "1" }) do
    args[#args + 1] = word
  end
  for key, value in pairs(flags) do
    args[#args + 1] = KEYS[key]
    args[#args + 1] = value
  end
  local code, output = run(args)
  if code ~= 0 then
    if output:find("cannot reach the planner", 1, true) and config.fail_open then
      slurm.log_info("memplan: job of uid %d passed unchecked: %s", submit_uid, output)
      return slurm.SUCCESS
    end
    local message = output:gsub("^memplan: ", ""):gsub("%s+$", "")
    slurm.log_user("memplan: %s", message)
    return slurm.ERROR
  end
  local plan_id = json_string(output, "plan_id")
  if output:match('"fits":%s*true') then
    job_desc.comment = comment .. ",plan=" .. plan_id
    slurm.log_info("memplan: %s fits %s (%s): %s", flags.model, gpu, partition, plan_id)
    return slurm.SUCCESS
  end
  slurm.log_user("memplan: %s on %s (partition %s): %s", flags.model, gpu, partition,
                 json_string(output, "reason"))
  return slurm.ERROR
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
