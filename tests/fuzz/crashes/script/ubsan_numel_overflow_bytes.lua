-- Finding (fuzz_script): heap-buffer-overflow from a sandboxed script. The
-- element count 2^31 x 2^31 = 2^62 fits int64, but its bytes (x 4) wrap to 0
-- in ck_tensor_bytes (vm/graph/graph.h:70, a size_t product): the plan gives the
-- input no memory, and p:forward's silu kernel (ops/cpu/activation.c:156)
-- reads and writes 2^62 floats from there. ASan: heap-buffer-overflow READ;
-- Release: memory corruption or SIGSEGV. Expected: a clean error at line 11
-- ("shape [...] is too large"). Reproduce: build-fuzz/fuzz_script THIS_FILE
-- (or build/ckrun THIS_FILE, which crashes).
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2147483648, 2147483648})
local p = g:compile{outputs = {ck.silu(x)}}
p:forward()
