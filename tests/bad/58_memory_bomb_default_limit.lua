-- expect: 58_memory_bomb_default_limit\.lua:4: (string\.rep: out of memory: a result of 32 MiB needs 64 MiB to build, which passes the Lua heap limit of 1 GiB|out of memory \(the Lua heap limit of 1 GiB is reached\))
-- A memory bomb under the default limit of the sandbox.
local parts = {}
for i = 1, 64 do parts[i] = string.rep("x", 1 << 25) .. i end
