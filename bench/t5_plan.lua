-- The planned memory of the T5-XXL encoder (ck.t5) at 512 tokens, batch 1,
-- with the attention mask, for each storage of its weights and activations.
-- Run: ckrun --plan [--device cuda] bench/t5_plan.lua
local t5 = require "ck.t5"
print(string.format("%-20s %9s %12s %14s", "storage", "peak GiB", "weights GiB", "the rest MiB"))
for _, s in ipairs{{"fp32"}, {"fp32", "bf16"}, {"bf16"}, {"bf16", "fp8"}} do
  local e <close> = t5.encoder{config = "t5-xxl", tokens = 512, mask = true, storage = s[1], frozen = s[2]}
  local p = e.program:plan()
  print(string.format("%-20s %9.2f %12.2f %14.1f", s[1] .. (s[2] and ", frozen " .. s[2] or ""), p.peak / 2 ^ 30,
    p.persistent / 2 ^ 30, (p.peak - p.persistent) / 2 ^ 20))
end
