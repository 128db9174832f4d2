-- fp16's loss scaling under data parallel training (compile{world_size = N}),
-- run by tests/sh/test_mpi_loss_scale.sh under `mpirun -np N ckrun`: when
-- one rank's gradients overflow, every rank skips the update and backs the
-- scale off, so the ranks' weights and scales stay equal; with and without
-- accumulation (the sums reduced after backward, or overlapped with it).
-- loss = mean((x w)^2): the fp16 activation gradient 2 x w scale overflows at
-- x = 64 with scale 2^10, and rank 1 alone is given x = 64 once.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local R, W = ck.rank(), ck.world_size()
for _, acc in ipairs{1, 2} do
  local g = ck.graph()
  local x = g:input("x", {1, 1})
  local w = g:param("w", {1, 1}, {init = "ones"})
  local h = ck.linear(x, w)
  local p = g:compile{loss = ck.mean(ck.mul(h, h)), optimizer = "sgd", lr = 0.25, weight_decay = 0,
                      precision = "fp16", accumulate = acc, world_size = W,
                      loss_scale = {init = 2 ^ 10, growth_interval = 100}}
  local seen = {}
  local n = acc == 1 and 3 or 4
  for s = 1, n do
    p:set(x, {(s == 2 and R == 1) and 64 or 1})
    local _, info = p:step()
    seen[s] = string.format("%g%s", info.loss_scale, info.overflow and "!" or "")
  end
  local all = ck.allgather({p:get("w")[1], p.loss_scale, p.updates})
  local same = true
  for r = 1, W - 1 do
    for k = 1, 3 do same = same and all[3 * r + k] == all[k] end
  end
  -- acc 1: step 1 from w = 1 (gradient 2), step 2 skipped, step 3 from w = 0.5 (gradient 1);
  -- acc 2: the update of steps 1-2 skipped, that of steps 3-4 from w = 1
  local want_scales = acc == 1 and "1024 1024! 512" or "1024 1024! 512 512"
  local want_w = acc == 1 and 0.25 or 0.5
  T.ok(table.concat(seen, " ") == want_scales and p:get("w")[1] == want_w and same,
    string.format("rank %d, accumulate %d: every rank skipped the update one rank's overflow spoiled and halved the " ..
      "scale (%s), and the ranks agree (w %g, scale %g, updates %d)", R, acc, table.concat(seen, " "), p:get("w")[1],
      p.loss_scale, p.updates))
end

T.done()
