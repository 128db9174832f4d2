-- Finding (fuzz_script, no crash): a shape table whose __len returns a
-- negative number is taken as a tensor of -3 dims. read_shape (vm/lua/lua_ck.c)
-- casts luaL_len to int and checks only ndim <= CK_MAX_DIMS, so ndim < 0
-- passes (and a length of 2^32 + 1 is truncated to 1). The graph then holds a
-- tensor with ndim -3 that compiles and runs; any rule or kernel that reads
-- shape.d[ndim - 1] reads out of the array. Expected: "shape has -3 dims" or
-- the raw length (lua_rawlen). This script ends with the error it should
-- never reach. Reproduce: build/ckrun THIS_FILE (or build-fuzz/fuzz_script)
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", setmetatable({}, {__len = function() return -3 end}))
local p = g:compile{outputs = {ck.silu(x)}}
p:forward()
error("accepted: a tensor of " .. #x.shape .. " dims and " .. x.numel .. " element")
