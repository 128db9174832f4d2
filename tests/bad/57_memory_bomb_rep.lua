-- flags: --max-heap 64MiB
-- expect: 57_memory_bomb_rep\.lua:4: string\.rep: out of memory: a result of 1 GiB passes the Lua heap limit of 64 MiB
-- One allocation of a gibibyte, far past the limit: string.rep refuses it before building it.
local s = string.rep("x", 1 << 30)
