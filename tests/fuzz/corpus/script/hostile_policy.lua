local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4, 3})
g:push_scope("blk")
local h = ck.silu(ck.linear(x, g:param("w", {2, 3})))
g:pop_scope()
local loss = ck.mse_loss(h, g:input("t", {4, 2}))
local other = g:compile{loss = loss}
local c = {loss = loss, stats = {grads = true, acts = true, blocks = {("b"):rep(1) .. "lk"}}}
local n = 0
c.checkpoint = function(t)
  n = n + 1
  if c.stats then c.stats.blocks[1] = nil; c.stats = nil end
  collectgarbage()
  for i = 1, 50 do g:param("late" .. n .. "_" .. i, {3}) end
  g:compile{loss = loss}
  if n == 1 then other:step(); local q <close> = other end
  return t.block == "blk" and "recompute" or "save"
end
local p = g:compile(c)
print(p:step(), p:enable_stats{grads = true, acts = true}.blocks[1], pcall(function() return other:plan() end))
