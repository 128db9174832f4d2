-- Finding (fuzz_script): an input whose element count overflows int64.
-- read_shape (vm/lua/lua_ck.c) accepts any non-negative dims, and
-- ck_shape_numel (ops/ops.h:170) multiplies them in int64_t: signed overflow
-- (undefined behaviour) in ck_tensor_bytes <- ck_compile (vm/run/program.c:173).
-- Release builds wrap around and plan a tensor of a wrong, possibly small,
-- size. Expected: a clean error at line 10 ("shape [..] has too many
-- elements"). Reproduce: build-fuzz/fuzz_script THIS_FILE
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {3037000500, 3037000500})
local p = g:compile{outputs = {ck.silu(x)}}
