--[[
memplan check in sbatch / salloc / srun: a Slurm cli_filter/lua plugin (slurm.conf:
CliFilterPlugins=cli_filter/lua, this file installed as cli_filter.lua next to slurm.conf on every
host users submit from). It runs in the user's own sbatch/salloc/srun process, before anything is
sent to slurmctld, so running the memplan CLI here costs the user's command its time and never
slurmctld's. job_submit.lua (same folder) is the optional server-side half: it only reads the tag
this plugin leaves, no subprocess.

A job opts in with a comment naming the model and workload:
  sbatch --partition=gpu-h100 --comment="memplan:model=llama-3.1-8b,batch=1,seq=4096" train.sh
  sbatch --partition=gpu-4090 \
    --comment="memplan:model=llama-3.1-8b,method=qlora,lora-rank=16,lora-targets=all,optimizer=adamw8bit" ...
Keys (`_` and `-` alike: lora_rank = lora-rank):
  model          a model preset (required)
  batch, seq, world-size, grad-accum     integers (defaults: memplan plan's, 1 / 4096 / 1 / 1)
  dtype          fp32 | bf16 | fp16 (default bf16)
  method         full | lora | qlora (default: lora when lora-rank is given, else full)
  lora-rank      LoRA rank (required by lora and qlora)
  lora-targets   modules separated by '+' (q_proj+v_proj), or all (required by lora and qlora)
  optimizer      adamw | adamw_bf16 | adamw8bit | sgd (default adamw)
The GPU comes from the job's (first) partition through `partitions` below. The plugin runs
`memplan --json plan` and reads its JSON answer with lua-cjson (Debian package lua-cjson): a job
that does not fit is refused with the planner's reason; one that fits gets ",plan=PLAN_ID"
appended to its comment. Comments without "memplan:", and comments already carrying a plan id,
pass untouched. When the planner cannot be reached the job passes (fail_open) with a warning.

Site settings are the `config` table; a file named by the environment variable
MEMPLAN_CLI_FILTER_CONFIG (a Lua chunk returning a table) overrides them.
deploy/slurm/README.md tells how to install it and what it does not guard against.
--]]

local cjson = require("cjson.safe")

local config = {
  memplan = "/usr/local/bin/memplan",        -- the memplan CLI
  planner = "planner.internal:50051",         -- --planner HOST:PORT
  cli_flags = {},                             -- e.g. {"--tls-ca", "/etc/memplan/ca.crt"}
  timeout_seconds = 10,
  partitions = { ["gpu-4090"] = "rtx-4090", ["gpu-h100"] = "h100-80gb" },
  default_partition = nil,                    -- the cluster's default, when --partition is absent
  fail_open = true,                           -- planner unreachable: let the job through
}

local override_path = os.getenv("MEMPLAN_CLI_FILTER_CONFIG")
if override_path ~= nil and override_path ~= "" then
  for key, value in pairs(dofile(override_path)) do config[key] = value end
end

-- Comment key -> memplan plan flag.
local FLAGS = { model = "--arch", batch = "--batch", seq = "--seq", ["world-size"] = "--world-size",
                ["grad-accum"] = "--grad-accum", dtype = "--dtype", ["lora-rank"] = "--lora-rank",
                ["lora-targets"] = "--lora-targets", optimizer = "--optimizer",
                ["gpus-per-node"] = "--gpus-per-node", ["host-memory-gib"] = "--host-memory-gib" }
local KEY_NAMES = "model, batch, seq, world-size, grad-accum, dtype, method, lora-rank, " ..
                  "lora-targets, optimizer, gpus-per-node, host-memory-gib"
-- Closed value sets, checked here so that the error names the comment's key.
local CHOICES = {
  dtype = { "fp32", "bf16", "fp16" },
  method = { "full", "lora", "qlora" },
  optimizer = { "adamw", "adamw_bf16", "adamw8bit", "sgd" },
}
local INTEGERS = { batch = true, seq = true, ["world-size"] = true, ["grad-accum"] = true,
                   ["lora-rank"] = true, ["gpus-per-node"] = true }
local NUMBERS = { ["host-memory-gib"] = true }

-- Values reach a shell (quoted): letters, digits and . _ - + only.
local function safe(value) return value:match("^[%w%._%-%+]+$") ~= nil end

local function quote(word) return "'" .. word:gsub("'", "'\\''") .. "'" end

local function one_of(value, allowed)
  for _, name in ipairs(allowed) do
    if value == name then return true end
  end
  return false
end

-- "k=v,k=v" (after "memplan:") -> table of key -> value, or nil, error.
local function parse_comment(spec)
  local keys = {}
  for pair in spec:gmatch("[^,]+") do
    local key, value = pair:match("^%s*([%w%-_]+)=(.*)$")
    if key == nil then return nil, "'" .. pair .. "' is not key=value" end
    key = key:gsub("_", "-")
    if FLAGS[key] == nil and key ~= "method" then
      return nil, "unknown key '" .. key .. "'; allowed: " .. KEY_NAMES
    end
    if not safe(value) then
      return nil, key .. "='" .. value .. "' has characters other than letters, digits and . _ - +"
    end
    if CHOICES[key] ~= nil and not one_of(value, CHOICES[key]) then
      return nil, key .. "='" .. value .. "': allowed: " .. table.concat(CHOICES[key], ", ")
    end
    if INTEGERS[key] and not value:match("^%d+$") then
      return nil, key .. "='" .. value .. "': expected a positive integer"
    end
    if NUMBERS[key] and not (value:match("^%d+$") or value:match("^%d+%.%d+$")) then
      return nil, key .. "='" .. value .. "': expected a positive number"
    end
    keys[key] = value
  end
  if keys.model == nil then return nil, "model=PRESET is required" end
  local method = keys.method or (keys["lora-rank"] and "lora" or "full")
  if method == "full" and (keys["lora-rank"] or keys["lora-targets"]) then
    return nil, "lora-rank and lora-targets need method=lora or method=qlora"
  end
  if method ~= "full" and (keys["lora-rank"] == nil or keys["lora-targets"] == nil) then
    return nil, "method=" .. method .. " needs lora-rank and lora-targets (modules joined by " ..
                "'+': q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; or all)"
  end
  keys.method = method
  return keys
end

-- Runs the CLI (argument words, each quoted); exit status and combined output.
local function run(args)
  local words = {}
  for _, word in ipairs(args) do words[#words + 1] = quote(word) end
  local pipe = io.popen(table.concat(words, " ") .. " 2>&1")
  local output = pipe:read("a")
  local _, _, code = pipe:close()
  return code or 0, output
end

local function plan_args(keys, gpu)
  local args = { config.memplan, "--planner", config.planner, "--timeout",
                 tostring(config.timeout_seconds), "--json" }
  for _, flag in ipairs(config.cli_flags) do args[#args + 1] = flag end
  for _, word in ipairs({ "plan", "--gpu", gpu, "--skip-limits", "--max-alternatives", "1" }) do
    args[#args + 1] = word
  end
  local names = {}
  for key in pairs(FLAGS) do names[#names + 1] = key end
  table.sort(names)  -- a stable command line, whatever the comment's order
  for _, key in ipairs(names) do
    local value = keys[key]
    if value ~= nil then
      if key == "lora-targets" then value = value:gsub("%+", ",") end
      args[#args + 1] = FLAGS[key]
      args[#args + 1] = value
    end
  end
  if keys.method == "qlora" then args[#args + 1] = "--qlora" end
  return args
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  local comment = options["comment"]
  if comment == nil or comment:sub(1, 8) ~= "memplan:" then return slurm.SUCCESS end
  -- Planned already (a resubmission, or a step inheriting the job's comment).
  if comment:match(",plan=plan%-%x+$") then return slurm.SUCCESS end
  local keys, err = parse_comment(comment:sub(9))
  if keys == nil then
    slurm.log_error("memplan: --comment: %s", err)
    return slurm.ERROR
  end
  local partition = (options["partition"] or config.default_partition or ""):match("^[^,]*")
  local gpu = config.partitions[partition]
  if gpu == nil then
    local known = {}
    for name in pairs(config.partitions) do known[#known + 1] = name end
    table.sort(known)
    slurm.log_error("memplan: partition '%s' has no GPU preset in cli_filter.lua; known: %s",
                    partition, table.concat(known, ", "))
    return slurm.ERROR
  end
  local code, output = run(plan_args(keys, gpu))
  if code ~= 0 then
    if output:find("cannot reach the planner", 1, true) and config.fail_open then
      slurm.log_info("memplan: job passed unchecked: %s", output)
      return slurm.SUCCESS
    end
    local message = output:gsub("^memplan: ", ""):gsub("%s+$", "")
    slurm.log_error("memplan: %s", message)
    return slurm.ERROR
  end
  local answer, decode_error = cjson.decode(output)
  if type(answer) ~= "table" then
    slurm.log_error("memplan: the CLI's answer is not JSON (%s): %s", tostring(decode_error),
                    output)
    return slurm.ERROR
  end
  local where = string.format("%s on %s (partition %s)", keys.model, gpu, partition)
  if answer.fits ~= true then
    slurm.log_error("memplan: %s: %s", where, tostring(answer.reason))
    return slurm.ERROR
  end
  options["comment"] = comment .. ",plan=" .. tostring(answer.plan_id)
  slurm.log_info("memplan: %s fits: %s", where, tostring(answer.plan_id))
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
