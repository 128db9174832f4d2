local ck = require "ck"
local g = ck.graph()
local n = 0
local function grow() for _ = 1, 300 do n = n + 1; g:param("grown" .. n, {4, 4}) end end
local mt = {__index = function() grow() collectgarbage() end, __len = function() grow() return 99 end,
  __eq = function() grow() return true end, __pairs = function(t) grow() return next, t end,
  __tostring = function() grow() return "x" end}
local function H(t) return setmetatable(t, mt) end
local x = g:input("x", H{4, 3})
local w = g:param("w", H{2, 3}, H{init = "normal", std = 0.1, lr_scale = 0.5})
local y = ck.reshape(ck.permute(ck.matmul(x, w, H{trans_b = true}), H{1, 0}), H{-1})
local t = g:input("t", {8})
local p = g:compile(H{loss = ck.mse_loss(y, t), outputs = H{y}, betas = H{0.5, 0.9},
  checkpoint = H{kind = "selective", recompute = H{"matmul"}}, stats = H{blocks = H{"w"}}})
print(pcall(g.compile, g, {loss = ck.mse_loss(y, t), seed = H{}}))
print(pcall(g.param, g, "bad", {2}, H{init = "bogus"}))
p:set(x, H{H{1, 2, 3}, H{4, 5, 6}, H{7, 8, 9}, H{1, 2, 3}})
print(p:step(H{lr = 0.1}), ck.json_encode(H{a = H{1, 2}}, H{indent = 2}))
