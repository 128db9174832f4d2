-- What a run holds beside its program's arena, and the bound on the whole
-- process that follows: the plan (the arena, planned to the byte) plus the
-- memory it does not plan, each stated (README, "Memory outside the plan").
local ck = require "ck"
local M = {}

-- The C library's and the threads' own: malloc's slack, thread stacks and
-- OpenBLAS's per-thread buffers. Measured on the CPU (tests/sh/
-- test_whole_run_memory.sh, BENCHMARKS.md "The whole run's memory") and
-- stated as a fixed part and a part per worker thread.
M.RUNTIME_FIXED = 16 * 2 ^ 20
M.RUNTIME_PER_THREAD = 4 * 2 ^ 20

-- The memory outside p's arena: rows {key, name, bytes, what} (host rows,
-- then device rows on a GPU), the bound on the process's peak RSS (nil on a
-- GPU, where the CUDA libraries' host memory is not planned, and when the Lua
-- heap has no cap), and the device's whole figure (nil on the CPU).
-- programs: every program the run holds at once, p among them (default {p}):
-- their graphs, op lists and stages are added up, and their arenas, one per
-- group of programs that share weights (compile{share}).
function M.outside(p, programs)
  local o = p:outside_plan()
  local plan = p:plan()
  local cpu = p:device() == "cpu"
  local graph, stage, ops, arenas, pinned, seen = 0, 0, 0, 0, 0, {}
  for _, q in ipairs(programs or {p}) do
    local qo, qp = q:outside_plan(), q:plan()
    graph, stage, ops = graph + qo.graph, stage + qo.stage, ops + qp.ops
    pinned = pinned + (qp.host_bytes or 0)
    if not seen[qp.group_id] then
      seen[qp.group_id] = true
      arenas = arenas + qp.group_arena
      pinned = pinned + (qp.weights_host_bytes or 0) -- a group's streamed weights: held once
    end
  end
  local nprog = #(programs or {p})
  local rows = {
    {"graph", "graph and op lists", graph, string.format("%d ops in the training list%s, %.0f bytes per op",
      ops, nprog > 1 and string.format("s of %d programs", nprog) or "", graph / math.max(1, ops))},
    {"stage", "host stage", stage, cpu and stage == 0 and "none: fp32 tensors are read in place" or
      "the host copy of the largest tensor read or written"},
    {"file_staging", "file staging", o.file_buffer, "safetensors' buffers: one file read and one written at a time"},
    {"lua_heap_limit", "Lua heap limit", o.lua_heap_limit, o.lua_heap_limit > 0 and
      string.format("--max-heap; %.1f MiB in use", o.lua_heap / 2 ^ 20) or "no cap: --max-heap sets one"},
    {"libraries", "executable and libraries", o.libraries, "resident now"},
    {"runtime", "runtime", M.RUNTIME_FIXED + o.threads * M.RUNTIME_PER_THREAD,
      string.format("malloc's slack, stacks and BLAS buffers of %d thread%s", o.threads, o.threads == 1 and "" or "s")},
  }
  if pinned > 0 then -- planned, but outside the arena: host memory (pinned on a GPU)
    rows[#rows + 1] = {"pinned", "pinned host memory", pinned,
      "the plan's: offloaded activations' host region and streamed weights and optimizer state"}
  end
  local host = 0
  for _, r in ipairs(rows) do host = host + r[3] end
  if cpu then
    local bound = o.lua_heap_limit > 0 and host + arenas or nil
    return rows, bound, nil, host, arenas
  end
  rows[#rows + 1] = {"device_fixed", "device: library workspace", o.device_fixed,
    "cuBLAS's workspace, a reduction scratch and the per-step values graph replays read"}
  rows[#rows + 1] = {"cuda_context", "device and host: CUDA", nil,
    "not planned: the CUDA context, the libraries' own memory (BENCHMARKS.md measures them) and the driver's " ..
    "copy of each list captured as a graph (a list with collectives or an embedding runs op by op)"}
  return rows, nil, plan.device_bytes, host, arenas
end

-- The rows for `--plan`'s table.
function M.print_rows(p)
  local rows, bound, device, host = M.outside(p)
  print("memory outside the plan (README, \"Memory outside the plan\"):")
  for _, r in ipairs(rows) do
    print(string.format("  %-28s %12s  %s", r[2], r[3] and string.format("%.1f MiB", r[3] / 2 ^ 20) or "-", r[4]))
  end
  if bound then
    print(string.format("%-24s %.1f MiB: the arena and the rows above; the process's peak RSS stays within it",
      "process bound", bound / 2 ^ 20))
  elseif device then
    print(string.format("%-24s %.1f MiB on the device (the arena in pages, and the library workspace); %.1f MiB on " ..
      "the host, and the CUDA libraries' own", "device and host", device / 2 ^ 20, host / 2 ^ 20))
  else
    print(string.format("%-24s none: the Lua heap has no cap (--max-heap)", "process bound"))
  end
end

-- {key, value} pairs for `--plan --json`: outside_plan = {key = bytes},
-- process_bound_bytes (or null), host_outside_bytes, and on a GPU
-- device_total_bytes.
function M.json_fields(p)
  local rows, bound, device, host = M.outside(p)
  local t = {}
  for _, r in ipairs(rows) do
    if r[3] then t[#t + 1] = {r[1] .. "_bytes", r[3]} end
  end
  local fields = {{"outside_plan", ck.json_object(t)}, {"host_outside_bytes", host},
                  {"process_bound_bytes", bound or ck.json_null}}
  if device then fields[#fields + 1] = {"device_total_bytes", device} end
  return fields
end

-- The device memory in use now (cudaMemGetInfo's total less free), or nil on
-- the CPU.
function M.device_used()
  if ck.device == "cpu" then return nil end
  local free, total = ck.device_memory()
  return free and total - free or nil
end

-- One line: the process's peak RSS so far against the bound; on a GPU the
-- device memory in use now against the plan, from device_before (the
-- memory in use before the program was compiled, M.device_used()).
-- programs as M.outside takes them; floor: a bound an earlier phase of the
-- run stated (the image encoders'), which the peak so far may have reached.
function M.summary(p, device_before, programs, floor)
  local _, bound, device, _, arena = M.outside(p, programs)
  if bound and floor and floor > bound then bound = floor end
  local _, peak = ck.rss()
  if device then
    local now = M.device_used()
    return string.format("memory: peak RSS %.1f MiB; the device's plan %.1f MiB%s", peak / 2 ^ 20, device / 2 ^ 20,
      now and device_before and string.format(", in use %.1f MiB more than before the program (%.1f MiB at the start)",
        (now - device_before) / 2 ^ 20, device_before / 2 ^ 20) or "")
  end
  if not bound then
    return string.format("memory: peak RSS %.1f MiB (no bound: the Lua heap has no cap)", peak / 2 ^ 20)
  end
  return string.format("memory: peak RSS %.1f MiB, %s the plan's bound of %.1f MiB (arena %.1f MiB + %.1f MiB outside it)",
    peak / 2 ^ 20, peak <= bound and "within" or "ABOVE", bound / 2 ^ 20, arena / 2 ^ 20, (bound - arena) / 2 ^ 20)
end

return M
