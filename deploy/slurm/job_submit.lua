--[[
memplan at job submission, server side: a Slurm job_submit/lua plugin (slurm.conf:
JobSubmitPlugins=lua, this file installed as job_submit.lua next to slurm.conf). Optional.

The planning itself happens in cli_filter.lua (same folder), in the user's sbatch/salloc/srun
process: it runs `memplan plan` for comments "memplan:model=...,..." and appends
",plan=PLAN_ID" when the job fits. This file runs inside slurmctld, so it starts no process and
makes no network call; it only reads what cli_filter.lua left:
  - "memplan:...,plan=plan-<16 hex>": logged (slurmctld's log ties the job to its plan);
  - "memplan:..." without a plan id: the job did not pass through the cli_filter (submitted from
    a host without it, through slurmrestd, or with the user's own slurm.conf). With
    require_plan = true it is refused, naming the reason; by default it is logged and passes.
Other comments pass untouched. A plan id is the user's claim, not verified here (slurmctld would
have to call the planner): see deploy/slurm/README.md for the trade-off.

Site settings are the `config` table; a file named by the environment variable
MEMPLAN_JOB_SUBMIT_CONFIG (a Lua chunk returning a table) overrides them.
--]]

local config = {
  require_plan = false,  -- refuse "memplan:" jobs that the cli_filter did not plan
}

local override_path = os.getenv("MEMPLAN_JOB_SUBMIT_CONFIG")
if override_path ~= nil and override_path ~= "" then
  for key, value in pairs(dofile(override_path)) do config[key] = value end
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local comment = job_desc.comment
  if comment == nil or comment:sub(1, 8) ~= "memplan:" then return slurm.SUCCESS end
  local plan_id = comment:match(",plan=(plan%-%x+)$")
  if plan_id ~= nil and #plan_id == 21 then
    slurm.log_info("memplan: job of uid %d planned by the cli_filter: %s", submit_uid, plan_id)
    return slurm.SUCCESS
  end
  if config.require_plan then
    slurm.log_user("memplan: this job's comment asks for a memplan check but carries no plan id: "
                   .. "submit it with sbatch/salloc/srun on a host whose slurm.conf has "
                   .. "CliFilterPlugins=cli_filter/lua (deploy/slurm/cli_filter.lua)")
    return slurm.ERROR
  end
  slurm.log_info("memplan: job of uid %d passed unchecked: no plan id in its comment "
                 .. "(cli_filter.lua did not run for it)", submit_uid)
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
