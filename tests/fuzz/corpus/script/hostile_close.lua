local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 2})
local y = ck.linear(x, g:param("w", {2, 2}))
local p = g:compile{loss = ck.mse_loss(y, g:input("t", {2, 2})), optimizer = "sgd"}
local function close() local q <close> = p end
local mt = {__index = function() close() end, __len = function() close() return 4 end,
  __tostring = function() close() return "m" end}
p:set(x, setmetatable({1, 2, 3, 4}, mt))
print(pcall(p.save, p, "hostile.safetensors", setmetatable({{"w", "w"}}, mt),
  {metadata = setmetatable({a = "1", b = setmetatable({}, mt)}, mt)}))
print(pcall(p.step, p, setmetatable({}, mt)))
print(pcall(function() return p:get(x) end))
