-- flags: --max-heap 64MiB
-- expect: 57_memory_bomb_rep\.lua: out of memory \(the Lua heap limit of 64 MiB is reached\)
-- One allocation of a gibibyte, far past the limit: the allocator refuses it (no line to name: Lua's
-- out-of-memory error carries none).
local s = string.rep("x", 1 << 30)
