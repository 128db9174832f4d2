local data = require "ck.data"
local ds = data.latents("synthetic", {n = 4, batch = 2, height = 4, width = 4, cross_attention_dim = 8, pooled_dim = 8, tokens = 4})
local idx = ds:next_indices()
x = #idx + ds.epoch
local sh = ds:shapes()
s = table.concat(sh.latents, "x")
