-- expect: 18_program_closed\.lua:11: program is closed
-- Using a program after its to-be-closed variable went out of scope.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2})
local q
do
  local p <close> = g:compile{outputs = {ck.silu(x)}}
  q = p
end
q:forward()
