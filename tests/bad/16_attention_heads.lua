-- expect: 16_attention_heads\.lua:6: attention
-- Attention whose width is not a multiple of the head count.
local ck = require "ck"
local g = ck.graph()
local q = g:input("q", {1, 4, 10})
local y = ck.attention(q, q, q, 3)
