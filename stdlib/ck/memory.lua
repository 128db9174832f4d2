-- What a run holds beside its program's arena, and the bound on the whole
-- process that follows: the plan (the arena, planned to the byte) plus the
-- memory it does not plan, each stated (README, "Memory outside the plan").
local ck = require "ck"
local M = {}

-- The C library's own: its arenas' slack, thread stacks and the BLAS
-- library's per-thread buffers, measured on the CPU (bench/whole_run.sh) and
-- stated here as an allowance per worker thread on top of a fixed part.
M.RUNTIME_FIXED = 16 * 2 ^ 20
M.RUNTIME_PER_THREAD = 4 * 2 ^ 20

-- rows {name, bytes, what} of the memory outside p's arena, and the bound
-- (nil when something in it has no cap: the Lua heap without --max-heap)
function M.outside(p)
  local o = p:outside_plan()
  local threads = o.threads
  local rows = {
    {"graph and op lists", o.graph, string.format("%d ops", p:plan().ops)},
    {"host stage", o.stage, "the host copy of the largest tensor read or written"},
    {"file staging", o.file_buffer or 0, "safetensors reads and writes"},
    {"Lua heap limit", o.lua_heap_limit, o.lua_heap_limit > 0 and string.format("%.1f MiB in use", o.lua_heap / 2 ^ 20)
      or "no cap (--max-heap sets one)"},
    {"executable and libraries", o.libraries, "resident now"},
    {"runtime", M.RUNTIME_FIXED + threads * M.RUNTIME_PER_THREAD, string.format("C library, %d threads", threads)},
  }
  local total = 0
  for _, r in ipairs(rows) do total = total + r[2] end
  local host = p:device() == "cpu"
  local arena = p:plan().arena
  local bound = o.lua_heap_limit > 0 and total + (host and arena or 0) or nil
  return rows, bound, o
end

-- One line: the process's peak RSS so far against the bound.
function M.summary(p)
  local _, bound = M.outside(p)
  local _, peak = ck.rss()
  local arena = p:device() == "cpu" and p:plan().arena or 0
  if not bound then
    return string.format("memory: peak RSS %.1f MiB (no bound: the Lua heap has no cap)", peak / 2 ^ 20)
  end
  return string.format("memory: peak RSS %.1f MiB, %s the plan's bound of %.1f MiB (arena %.1f MiB + %.1f MiB outside it)",
    peak / 2 ^ 20, peak <= bound and "within" or "ABOVE", bound / 2 ^ 20, arena / 2 ^ 20, (bound - arena) / 2 ^ 20)
end

return M
