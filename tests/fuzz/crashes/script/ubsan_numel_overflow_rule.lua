-- Finding (fuzz_script): shape rules compute output dims without overflow
-- checks. After 32 upsample2x ops a [1,1,1,1] input is [1,1,2^32,2^32]: the
-- element count overflows in ck_shape_numel (ops/ops.h:170) <- ck_tensor_bytes
-- <- ck_plan_memory (vm/plan/memplan.c:232); after 63 the dim itself overflows in
-- the rule (ops/rules.c:379, d * 2). Expected: the op's rule refuses the shape
-- with a message naming the line. Reproduce: build-fuzz/fuzz_script THIS_FILE
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 1, 1, 1})
for i = 1, 32 do x = ck.upsample2x(x) end
local p = g:compile{outputs = {x}}
for i = 1, 32 do x = ck.upsample2x(x) end
