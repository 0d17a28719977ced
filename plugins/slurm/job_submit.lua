--[[
vjob job_submit.lua -- tags each job with its class and OS image at submission.

Install: copy this file next to slurm.conf (Slurm loads job_submit.lua from that directory),
set JobSubmitPlugins=lua, and let vjob write vjob-images.list beside it (one image name per
line). See docs/slurm.md.

What it does, in slurmctld, under the job lock -- so it only reads one small file, cached:
  * class: "interactive" for salloc/srun without a batch script, "batch" otherwise;
  * OS image: from --comment=vjob:os=NAME or a "#VJOB os=NAME" line among the script's
    leading comment lines; refused with a clear message when the name is malformed, when
    comment and script disagree, or when the name is not in vjob-images.list;
  * records "vjob:class=CLASS,os=NAME" in the job's admin comment (users cannot set it);
  * site default: a batch job naming no image, in a partition the operator marked (the file
    vjob-partitions.conf beside this script, written by vjob from [slurm] vjob_partitions),
    gets that partition's image; "#VJOB off" opts out where allow_opt_out=yes, else the job is
    refused saying so. No partition given: Slurm's default partition (part_list's flag);
  * a batch job asking for a real image (anything but the counter guest debian-tiny) gets its
    script wrapped: job_desc.script becomes a small /bin/sh wrapper that runs
    `vjob run --os NAME --script - -- "$@"` with the original script as a quoted
    here-document. The user's script is kept byte for byte and runs unchanged in the guest,
    as the user, in the job's working directory; the pilot exits with the script's status.
    Why here and not SPANK or a TaskProlog: docs/slurm-agent.md, "Transparent submission".
    A script without a final newline goes base64 (`--base64`) and is refused over
    MAX_WRAP_BYTES (1 MiB): base64 in Lua under the job lock costs ~0.35 s a MiB;
  * a real image's job whose memory per node (--mem; --mem-per-cpu times the fewest CPUs a node
    of the job may get; --mem=0: the whole node), minus the VM's overhead, is below the guest's
    minimum, or which is above the largest node's memory, is refused with the numbers. The
    figures come from vjob-vm-sizes beside this script (plugins.slurm.vm_sizes, written by the
    agent from [provisioning] vm_overhead_mib and the nodes' RealMemory); without it from
    VM_OVERHEAD_MIB and REAL_MIN_MIB below, and only the minimum is checked;
  * wakes the vjob agent when it accepts an interactive job: rewrites the small file
    vjob-agent.wake next to this script, whose change the agent watches (vjob.agent), so that
    the agent checkpoints victims at once instead of at its next tick. The file must exist and
    be writable by SlurmUser (deploy/devcluster creates it; see docs/slurm-agent.md).
  * deadline (docs/deadline.md): a job with a deadline (Slurm's own --deadline where this Slurm
    shows it to Lua, else --comment=vjob:deadline=EPOCH or "#VJOB deadline=EPOCH") and a time
    limit is refused when its x-factor x = (limit × slowdown − time to deadline) / (limit ×
    slowdown) is at or over the X the agent publishes in vjob-deadline.threshold beside this
    script; the message gives x, X and why. Missing, malformed or stale file (older than the
    file's own stale=, the agent's [deadline] stale_after_s): no check (fail open).
It fails open: if anything goes wrong inside (the list unreadable, the wake file missing or not
writable, a bug), the job is accepted unchanged and the error is logged in slurmctld's log.
A missing list accepts every valid name.
]]

local LIST_NAME = "vjob-images.list"
local DEFAULTS_NAME = "vjob-partitions.conf" -- plugins.slurm.site_default.DEFAULTS_NAME
local THRESHOLD_NAME = "vjob-deadline.threshold" -- preemption.deadline.threshold_file
local THRESHOLD_STALE_SECONDS = 600 -- for a file without "stale=" (the agent writes its [deadline] stale_after_s)
local THRESHOLD_MAX_STALE = 86400 -- threshold_file.MAX_STALE_S
local WAKE_NAME = "vjob-agent.wake" -- vjob.agent.SLURM_WAKE_NAME
local WAKE_WARN_SECONDS = 600 -- a wake file that cannot be written is logged this seldom
local CACHE_SECONDS = 2
local MAX_SCRIPT_LINES = 200
-- The largest script wrapped in base64 (one without a final newline): base64 in pure Lua costs
-- slurmctld about 0.35 s per MiB, inside its job lock (every RPC waits), and the wrapped script
-- is 4/3 of it plus a header. A bigger one is refused with this limit named. A script ending in
-- a newline is wrapped as it is (a header more), within Slurm's own max_script_size.
local MAX_WRAP_BYTES = 1048576
-- Slurm's default SchedulerParameters=max_script_size, checked on the wrapped script after this
-- plugin (with a cryptic "Pathname ... too long"): a script whose wrapper passes it is refused
-- here, with the sizes. A site with a larger max_script_size raises this with it.
local MAX_SCRIPT_BYTES = 4194304
local NO_VAL = 4294967294 -- Slurm's "not set" for 32-bit fields
local COUNTER_IMAGE = "debian-tiny" -- the counter guest runs no script: never wrapped
-- A real image's VM gets the job's memory on the node minus QEMU's overhead (pilot.sizing); a
-- guest needs REAL_MIN_MIB. Keep VM_OVERHEAD_MIB at [provisioning] vm_overhead_mib (a test checks
-- the default); the pilot refuses again at start with the configured figure.
local VM_OVERHEAD_MIB = 256
local REAL_MIN_MIB = 256 -- pilot.specs.REAL_MIN_MEMORY_MIB
local MAX_MEM_MIB = 1099511627776 -- larger: Slurm's NO_VAL64 ("not set"), as Lua's double sees it
local NO_VAL16 = 65534 -- Slurm's "not set" for 16-bit fields (cpus_per_task, ntasks_per_node)
local SIZES_NAME = "vjob-vm-sizes" -- plugins.slurm.vm_sizes.SIZES_NAME
local WRAP_MARK = "# vjob wrapper (job_submit.lua)"
local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

-- base64 in 76-character lines; plain arithmetic (Lua 5.1 has no bit operators).
local function base64(data)
   local out, groups = {}, 0
   for i = 1, #data, 3 do
      local a, b, c = data:byte(i, i + 2)
      local n = a * 65536 + (b or 0) * 256 + (c or 0)
      local d1, d2 = math.floor(n / 262144) % 64, math.floor(n / 4096) % 64
      local d3, d4 = math.floor(n / 64) % 64, n % 64
      out[#out + 1] = B64:sub(d1 + 1, d1 + 1) .. B64:sub(d2 + 1, d2 + 1)
         .. (b and B64:sub(d3 + 1, d3 + 1) or "=") .. (c and B64:sub(d4 + 1, d4 + 1) or "=")
      groups = groups + 1
      if groups % 19 == 0 then out[#out + 1] = "\n" end
   end
   return table.concat(out)
end

-- The wrapper slurmd runs instead of the user's script; the image name was validated. A script
-- ending in a newline goes in as it is, in a quoted here-document (nothing expanded) closed by a
-- random line the script does not hold: a copy and a find in C, ms for 4 MiB. Any other script
-- is base64 (bounded by MAX_WRAP_BYTES). nil when no delimiter was found (the caller refuses).
local function wrap(script, os_name)
   local head = "#!/bin/sh\n" .. WRAP_MARK .. ": the job's own script runs unchanged in a VM of image "
      .. os_name .. ";\n# it is below. See docs/realjobs.md.\n#VJOB os=" .. os_name .. "\n"
      .. "exec vjob run --os " .. os_name .. " --script - "
   if script:sub(-1) == "\n" then
      for _ = 1, 4 do
         local delim = string.format("VJOB_SCRIPT_END_%06x%06x", math.random(0, 16777215), math.random(0, 16777215))
         if not script:find(delim, 1, true) then
            return head .. "-- \"$@\" <<'" .. delim .. "'\n" .. script .. delim .. "\n"
         end
      end
      return nil
   end
   local encoded = base64(script)
   if encoded:sub(-1) ~= "\n" then encoded = encoded .. "\n" end
   return head .. "--base64 -- \"$@\" <<'VJOB_SCRIPT_END'\n" .. encoded .. "VJOB_SCRIPT_END\n"
end

local function here()
   local source = debug.getinfo(1, "S").source or ""
   if source:sub(1, 1) == "@" then
      local dir = source:sub(2):match("^(.*)/[^/]*$")
      if dir then return dir end
   end
   return "/etc/slurm"
end

local LIST_PATH = here() .. "/" .. LIST_NAME
local WAKE_PATH = here() .. "/" .. WAKE_NAME
local THRESHOLD_PATH = here() .. "/" .. THRESHOLD_NAME
local DEFAULTS_PATH = here() .. "/" .. DEFAULTS_NAME
local SIZES_PATH = here() .. "/" .. SIZES_NAME

-- The published threshold, or nil (no check) when missing, malformed, stale or from the future.
local function load_threshold(now)
   local f = io.open(THRESHOLD_PATH, "r")
   if not f then return nil end
   local line = f:read(256)
   f:close()
   if not line then return nil end
   local x, slow, at, rest = line:match("^x=(%-?%d+%.?%d*) slowdown=(%d+%.?%d*) at=(%d+)(.-)\n?$")
   local stale = THRESHOLD_STALE_SECONDS
   if rest and rest ~= "" then
      stale = tonumber(rest:match("^ stale=(%d+)$"))
      if not stale or stale < 1 or stale > THRESHOLD_MAX_STALE then return nil end
   end
   x, slow, at = tonumber(x), tonumber(slow), tonumber(at)
   if not x or not slow or not at or slow <= 0 then return nil end
   if now - at > stale or at - now > 60 then return nil end
   return x, slow
end

local function deadline_of(job_desc)
   local d = tonumber(job_desc.deadline)
   if d and d > 0 and d < NO_VAL then return d end
   local c = job_desc.comment and (job_desc.comment:match("^vjob:deadline=(%d+)") or job_desc.comment:match("[%s,;]vjob:deadline=(%d+)"))
   if c then return tonumber(c) end
   if not job_desc.script then return nil end
   local count = 0
   for line in job_desc.script:gmatch("([^\n]*)\n?") do
      count = count + 1
      if count > MAX_SCRIPT_LINES then break end
      if count > 1 then
         local s = line:match("^%s*(.-)%s*$")
         if s ~= "" then
            if s:sub(1, 1) ~= "#" then break end
            local v = s:match("^#VJOB%s+deadline=(%d+)$")
            if v then return tonumber(v) end
         end
      end
   end
   return nil
end

-- nil to accept, or the refusal. Only when a deadline, a time limit and a fresh threshold exist.
local function check_deadline(job_desc)
   local deadline = deadline_of(job_desc)
   local limit = tonumber(job_desc.time_limit)
   if not deadline or not limit or limit <= 0 or limit >= NO_VAL then return nil end
   local now = os.time()
   local X, slow = load_threshold(now)
   if not X then return nil end
   local remaining = limit * 60 * slow
   local x = (remaining - (deadline - now)) / remaining
   if x < X then return nil end
   return string.format("vjob: refused: the job cannot be expected to meet its deadline: x = %.2f >= X = %.2f "
      .. "(time limit %d min x VM slowdown %.2f = %.0f min to run, deadline in %.0f min); "
      .. "ask for a later deadline or a shorter time limit", x, X, limit, slow, remaining / 60, (deadline - now) / 60)
end

-- cache = { at = os.time() of the read, names = set or nil when the file is missing }
local cache = nil

local function load_names()
   local now = os.time()
   if cache and now - cache.at < CACHE_SECONDS then return cache.names end
   local f = io.open(LIST_PATH, "r")
   local names = nil
   if f then
      names = {}
      for line in f:lines() do -- raises on a read error: caught by pcall below, job accepted
         local name = line:match("^%s*(.-)%s*$")
         if name ~= "" and name:sub(1, 1) ~= "#" then names[name] = true end
      end
      f:close()
   end
   cache = { at = now, names = names }
   return names
end

local function valid_name(name)
   return #name >= 1 and #name <= 64 and name:match("^[%w][%w%._%-]*$") ~= nil
end

local function from_comment(comment)
   if not comment then return nil end
   local name = comment:match("^vjob:os=([^%s,;]*)") or comment:match("[%s,;]vjob:os=([^%s,;]*)")
   return name
end

-- The image a "#VJOB os=NAME" line asks for (nil: none), and whether a "#VJOB off" line opts out.
local function from_script(script)
   if not script then return nil, false end
   local found, off = nil, false
   local count = 0
   for line in script:gmatch("([^\n]*)\n?") do
      count = count + 1
      if count > MAX_SCRIPT_LINES then break end
      if count > 1 then -- the first line is the shebang
         local s = line:match("^%s*(.-)%s*$")
         if s ~= "" then
            if s:sub(1, 1) ~= "#" then break end
            local name = s:match("^#VJOB%s+os=(%S*)$")
            if name then found = name end
            if s:match("^#VJOB%s+off$") then off = true end
         end
      end
   end
   return found, off
end

-- The operator's partition defaults (docs/realjobs.md, "Every job of a partition"): the file vjob
-- writes from [slurm] vjob_partitions and allow_opt_out, lines "allow_opt_out=yes|no" and
-- "PARTITION IMAGE". Missing: no partition is marked. Cached like the image list.
local defaults_cache = nil

local function load_defaults()
   local now = os.time()
   if defaults_cache and now - defaults_cache.at < CACHE_SECONDS then return defaults_cache end
   local images, opt_out = {}, false
   local f = io.open(DEFAULTS_PATH, "r")
   if f then
      for line in f:lines() do
         local s = line:match("^%s*(.-)%s*$")
         local allow = s:match("^allow_opt_out=(%a+)$")
         local part, image = s:match("^([%w][%w%._%-]*)%s+([%w][%w%._%-]*)$")
         if allow then opt_out = allow == "yes"
         elseif part then images[part] = image end
      end
      f:close()
   end
   defaults_cache = { at = now, images = images, opt_out = opt_out }
   return defaults_cache
end

-- The partition Slurm will put the job in and its default image, or nil: the first partition
-- the job names that is marked, or (none named) the default partition (part_list's flag).
local function partition_default(job_desc, part_list, images)
   if job_desc.partition and job_desc.partition ~= "" then
      for name in job_desc.partition:gmatch("[^,]+") do
         if images[name] then return name, images[name] end
      end
      return nil
   end
   for _, part in pairs(type(part_list) == "table" and part_list or {}) do
      if part.flag_default == 1 and part.name and images[part.name] then return part.name, images[part.name] end
   end
   return nil
end

-- The image a batch job gets from its partition, "" for none, or nil and the refusal.
local function site_default(job_desc, part_list, asked, off)
   if off and asked ~= "" then
      return nil, string.format("vjob: the script says both '#VJOB off' and os=%s: give one", asked)
   end
   if asked ~= "" then return asked end
   local defaults = load_defaults()
   local part, image = partition_default(job_desc, part_list, defaults.images)
   if not part then return "" end
   if not off then return image end
   if defaults.opt_out then return "" end
   return nil, string.format("vjob: every job of partition %s runs in a VM (image %s) and this site does not let "
                             .. "a job opt out: remove '#VJOB off' or submit to another partition", part, image)
end

-- The largest node count any partition the job may use offers (nil when unknown).
local function largest_partition(job_desc, part_list)
   if type(part_list) ~= "table" then return nil end
   local wanted = {}
   if job_desc.partition and job_desc.partition ~= "" then
      for name in job_desc.partition:gmatch("[^,]+") do wanted[name] = true end
   end
   local best, names = nil, {}
   for _, part in pairs(part_list) do
      local name = part.name
      local total = tonumber(part.total_nodes)
      if name and total and (next(wanted) == nil and part.flag_default == 1 or wanted[name]) then
         if not best or total > best then best = total end
         names[#names + 1] = name
      end
   end
   return best, table.concat(names, ",")
end

-- The figures vjob publishes beside this script (plugins.slurm.vm_sizes), cached like the list;
-- missing or malformed: the built-in defaults and no node figure (no upper check).
local sizes_cache = nil
local function load_sizes()
   local now = os.time()
   if sizes_cache and now - sizes_cache.at < CACHE_SECONDS then return sizes_cache end
   local s = { at = now, overhead = VM_OVERHEAD_MIB, min = REAL_MIN_MIB, node_max = nil }
   local f = io.open(SIZES_PATH, "r")
   if f then
      local line = f:read(256) or ""
      f:close()
      local o, m, n = line:match("^overhead_mib=(%d+) guest_min_mib=(%d+) node_max_mib=(%d+)%s*$")
      if o then s.overhead, s.min, s.node_max = tonumber(o), tonumber(m), tonumber(n) end
   end
   sizes_cache = s
   return s
end

-- The fewest CPUs Slurm may give the job on one of its nodes: --ntasks-per-node tasks of
-- --cpus-per-task each, all of its CPUs when it asks for one node, else one task's.
local function fewest_cpus_per_node(job_desc)
   local c = tonumber(job_desc.cpus_per_task)
   if not c or c < 1 or c >= NO_VAL16 then c = 1 end
   local tasks = tonumber(job_desc.ntasks_per_node)
   if tasks and tasks >= 1 and tasks < NO_VAL16 then return c * tasks end
   local cpus = tonumber(job_desc.min_cpus)
   if tonumber(job_desc.max_nodes) == 1 and cpus and cpus < NO_VAL then return math.max(c, cpus) end
   return c
end

-- The job's memory on a node as asked: (MiB, 0 for "the whole node", and how it was asked), or
-- nil when it asked none (the site's DefMemPerCPU or the whole node: the pilot reads it at start).
local function asked_memory(job_desc)
   local per_node = tonumber(job_desc.min_mem_per_node)
   if per_node and per_node >= 0 and per_node < MAX_MEM_MIB then
      return per_node, string.format("--mem=%dM", per_node)
   end
   local per_cpu = tonumber(job_desc.min_mem_per_cpu)
   if per_cpu and per_cpu >= 0 and per_cpu < MAX_MEM_MIB then
      if per_cpu == 0 then return 0, "--mem-per-cpu=0" end
      local cpus = fewest_cpus_per_node(job_desc)
      return per_cpu * cpus, string.format("--mem-per-cpu=%dM x %d CPU%s (the fewest a node of this job may get) = %d MiB",
                                           per_cpu, cpus, cpus == 1 and "" or "s", per_cpu * cpus)
   end
   return nil
end

-- A real image's job whose memory per node no VM can honour: the refusal's message, else nil.
local function memory_refusal(job_desc)
   local mem, how = asked_memory(job_desc)
   if not mem then return nil end
   local s = load_sizes()
   if mem == 0 then -- whole nodes: the largest node's memory, when known
      if not s.node_max then return nil end
      mem, how = s.node_max, string.format("%s (whole nodes, the largest of %d MiB)", how, s.node_max)
   end
   if mem - s.overhead < s.min then
      return string.format("vjob: %s leaves %d MiB for the VM after its overhead of %d MiB, below the guest's "
                           .. "minimum of %d MiB: ask for at least --mem=%dM per node", how, mem - s.overhead,
                           s.overhead, s.min, s.min + s.overhead)
   end
   if s.node_max and mem > s.node_max then
      return string.format("vjob: %s is more than the largest node's %d MiB, whose VM gets at most %d MiB (its "
                           .. "memory minus the VM's overhead of %d MiB): ask for at most --mem=%dM per node, or "
                           .. "--mem=0 for whole nodes", how, s.node_max, s.node_max - s.overhead, s.overhead,
                           s.node_max)
   end
   return nil
end

-- Returns nil to accept, or the message telling the user why the job is refused.
local function tag(job_desc, part_list)
   local min_nodes = tonumber(job_desc.min_nodes)
   if min_nodes and min_nodes > 0 and min_nodes < NO_VAL then
      local largest, names = largest_partition(job_desc, part_list)
      if largest and min_nodes > largest then
         return string.format("vjob: the job asks for %d nodes but partition %s has only %d", min_nodes, names, largest)
      end
   end
   local batch = job_desc.script ~= nil and job_desc.script ~= ""
   local class = batch and "batch" or "interactive"
   local a = from_comment(job_desc.comment)
   local b, off = from_script(job_desc.script)
   if a and b and a ~= b then
      return string.format("vjob: the comment asks for OS image '%s' but the script's #VJOB line for '%s': give one", a, b)
   end
   local os_name = a or b or ""
   if batch then
      local refusal
      os_name, refusal = site_default(job_desc, part_list, os_name, off)
      if refusal then return refusal end
   end
   if os_name ~= "" then
      if not valid_name(os_name) then
         return string.format("vjob: OS image name '%s' is malformed: 1-64 letters, digits, '.', '_' or '-'", os_name)
      end
      local names = load_names()
      if names and not names[os_name] then
         local known = {}
         for n in pairs(names) do known[#known + 1] = n end
         table.sort(known)
         return string.format("vjob: unknown OS image '%s'%s; known images: %s", os_name,
                              (a or b) and "" or " (the partition's default: [slurm] vjob_partitions)",
                              #known > 0 and table.concat(known, ", ") or "(none)")
      end
   end
   if batch and os_name ~= "" and os_name ~= COUNTER_IMAGE and not job_desc.script:find(WRAP_MARK, 1, true) then
      if #job_desc.script > MAX_WRAP_BYTES and job_desc.script:sub(-1) ~= "\n" then
         return string.format("vjob: the job script is %d bytes and does not end with a newline; vjob runs such "
                              .. "scripts of at most %d bytes (1 MiB) in a VM: end it with a newline",
                              #job_desc.script, MAX_WRAP_BYTES)
      end
      local too_small = memory_refusal(job_desc)
      if too_small then return too_small end
      local wrapped = wrap(job_desc.script, os_name)
      if not wrapped then return "vjob: the job script holds vjob's here-document delimiters: rename those lines" end
      if #wrapped > MAX_SCRIPT_BYTES then
         return string.format("vjob: the job script is %d bytes; wrapped to run in a VM it would be %d, over Slurm's "
                              .. "max_script_size of %d bytes: keep the data in a file the script reads",
                              #job_desc.script, #wrapped, MAX_SCRIPT_BYTES)
      end
      job_desc.script = wrapped
   end
   local ok_d, refusal = pcall(check_deadline, job_desc)
   if not ok_d then
      slurm.log_error("vjob job_submit.lua: deadline check failed, job accepted: %s", tostring(refusal))
   elseif refusal then
      return refusal
   end
   local label = "vjob:class=" .. class .. ",os=" .. os_name
   local ok_dl, dl = pcall(deadline_of, job_desc)
   if ok_dl and dl then label = label .. ",deadline=" .. string.format("%d", dl) end
   local old = job_desc.admin_comment
   if old and old ~= "" then label = label .. " " .. old end
   job_desc.admin_comment = label
   return nil
end

local wake_warned_at = nil

-- Rewrite the wake file: its new modification time tells the agent an interactive job came.
-- One open/write/close of a local file; no retry, no wait. A missing or unwritable file is
-- logged at most every WAKE_WARN_SECONDS: the agent then acts at its next tick instead.
local function wake_agent(job_desc)
   if job_desc.script ~= nil and job_desc.script ~= "" then return end -- batch: nothing to hurry
   local f, err = io.open(WAKE_PATH, "w")
   if not f then
      local now = os.time()
      if not wake_warned_at or now - wake_warned_at >= WAKE_WARN_SECONDS then
         wake_warned_at = now
         slurm.log_info("vjob job_submit.lua: cannot wake the vjob agent (%s); it acts at its next tick", tostring(err))
      end
      return
   end
   f:write(os.time(), "\n")
   f:close()
end

local function accepted(job_desc)
   local ok, err = pcall(wake_agent, job_desc)
   if not ok then slurm.log_error("vjob job_submit.lua: waking the agent failed: %s", tostring(err)) end
   return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local ok, refusal = pcall(tag, job_desc, part_list)
   if not ok then
      slurm.log_error("vjob job_submit.lua: internal error, job accepted unchanged: %s", tostring(refusal))
      return accepted(job_desc)
   end
   if refusal then
      slurm.log_info("vjob job_submit.lua: refused a job of uid %u: %s", submit_uid, refusal)
      slurm.log_user("%s", refusal)
      return slurm.ERROR
   end
   return accepted(job_desc)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
