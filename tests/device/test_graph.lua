-- Graph replay on the CUDA backend: a training program whose lists are each
-- captured once as a CUDA graph and replayed at every later step trains
-- bitwise as the same program run op by op (compile{cuda_graph = false}):
-- AdamW with its update count, dropout keyed by the step, a learning rate
-- that changes every step, logging steps with statistics, evaluation passes
-- with dropout on and off, SGD, Lion and 8-bit AdamW, accumulation with
-- clipping, a guarded step skipped; a measured peak is the plan's under
-- replay, replay takes no device memory the plan does not state (on the
-- emulator), the captured path is the one taken, and profiling runs op by op.
--
-- Run by ckrun --trust (cmake/cuda.cmake) on a CUDA device (skipped, exit 77,
-- where there is none) and on the CPU emulator of the CUDA backend
-- (CK_CUDA_MODULE=libck_cuda_emu.so, CK_EMU_GRAPH_LOG: the emulator's count
-- of graph launches, read back here).
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"

local usable = false
for _, d in ipairs(ck.devices()) do usable = usable or d == "cuda" end
if not usable then
  print("SKIP: no CUDA device is usable here (no driver, no device, or a build without the CUDA backend)")
  os.exit(77)
end

local config = unet.config("sdxl-tiny")
config.dropout = 0.1
config.block_out_channels = {8, 16, 16}
config.layers_per_block = 1 -- small: the emulator runs every GPU thread in turn (and under ASan)
config.norm_num_groups = 4
config.transformer_layers_per_block = {1, 1, 1}
config.attention_head_dim = {1, 2, 2}
config.cross_attention_dim = 16
config.addition_time_embed_dim = 8
config.projection_class_embeddings_input_dim = 16 + 6 * 8
local shape = {batch = 1, height = 8, width = 8}

local log = os.getenv("CK_EMU_GRAPH_LOG")
local function launches()
  local f = log and io.open(log)
  if not f then return 0 end
  local n = tonumber(f:read("a"):match("launches (%d+)")) or 0
  f:close()
  return n
end

local function build(graph)
  local _, p = T.unet_step(config, shape, {optimizer = "adamw", lr = 1e-3, seed = 5, device = "cuda",
    cuda_graph = graph, stats = {blocks = {}}})
  return p
end

local used0
do
  local free, total = ck.device_memory()
  used0 = total - free
end
local pg, pe = build(true), build(false)
local free, total = ck.device_memory()
local used = total - free
if log then os.remove(log) end
local n0 = launches()

-- AdamW at a changing learning rate: a plain step (the training list
-- captured), a logging step (its list captured), evaluation passes (the
-- forward list captured, dropout on, off, on again), then a measured step
-- (the training list replayed)
local same, info_g, info_e = true, nil, nil
for s = 1, 2 do
  local o = {lr = 1e-3 / s, stats = s == 2 and "all" or nil}
  local lg, ig = pg:step(o)
  local le, ie = pe:step(o)
  same = same and lg == le
  if s == 2 then info_g, info_e = ig, ie end
end
T.ok(info_g.grad_norm == info_e.grad_norm and next(info_g.acts) ~= nil, string.format(
  "a logging step's list captured: the gradient norm %.9g is the op-by-op run's %.9g", info_g.grad_norm,
  info_e.grad_norm))
local a1, b1 = pg:forward(), pe:forward()
pg.training, pe.training = false, false
local a2, b2 = pg:forward(), pe:forward()
pg.training, pe.training = true, true
local a3, b3 = pg:forward(), pe:forward()
T.ok(a1 == b1 and a2 == b2 and a3 == b3 and a2 ~= a1 and a3 == a1, string.format(
  "a replayed forward list reads the evaluation flag at each run: %.9g, %.9g (eval), %.9g, as op by op", a1, a2, a3))
local lg, ig = pg:step{lr = 3e-4, measure = true}
local le, ie = pe:step{lr = 3e-4, measure = true}
T.ok(same and lg == le, "3 steps (AdamW, dropout, the learning rate changed each step) replayed as graphs give the " ..
  "losses of the same steps run op by op, bitwise")
local differ = {}
for _, name in ipairs(pg:state_tensors()) do
  if pg:checksum(name) ~= pe:checksum(name) then differ[#differ + 1] = name end
end
T.ok(#pg:state_tensors() > 0 and #differ == 0, string.format(
  "and end with the same weights and AdamW moments, bitwise (%d tensors; %d differ%s)", #pg:state_tensors(), #differ,
  #differ > 0 and ", the first " .. differ[1] or ""))
T.ok(ig.high_water == pg:plan().peak and ie.high_water == pe:plan().peak, string.format(
  "a measured step under replay: the arena's high-water mark %d is the plan's peak %d", ig.high_water, pg:plan().peak))
do
  -- the training list in two ranges (forward and backward, then the update),
  -- the logging list in two, the forward list in one
  local g, e = pg:graphs(), pe:graphs()
  T.ok(g.captures == 5 and g.launches == 2 * 3 + 3 and g.op_by_op == 0 and e.captures + e.launches == 0,
    string.format("each list's ranges are captured once and replayed: %d captures, %d launches " ..
      "(compile{cuda_graph = false}: %d, %d)", g.captures, g.launches, e.captures, e.launches))
end
if log then
  -- on the emulator, whose device memory is cudaMalloc's alone (a driver
  -- keeps its copy of each graph in memory of its own: README, "Memory
  -- outside the plan")
  local f2, t2 = ck.device_memory()
  T.ok(t2 - f2 == used and used > used0, string.format(
    "captured graphs take no device memory beyond the plans (%d bytes in use after compile and after 3 steps)", t2 - f2))
  local n = launches() - n0
  T.ok(n == pg:graphs().launches, string.format("the captured path is taken: the emulator ran %d graph launches", n))
end

-- every optimizer kernel that reads the step block, gradient accumulation with
-- clipping (three parts a list), and a guarded step skipped on a NaN (the
-- update count then falls behind the step): an MLP, graphs against op by op
for _, opt in ipairs{{optimizer = "sgd"}, {optimizer = "lion"}, {optimizer = "adamw8bit"},
                     {optimizer = "adamw", accumulate = 2, max_grad_norm = 0.5}} do
  local ps = {}
  for k, graph in ipairs{true, false} do
    local g, c, x, t = T.mlp(4, {lr = 1e-2, seed = 2, device = "cuda", cuda_graph = graph}, opt)
    ps[k] = {p = g:compile(c), x = x}
    T.set_random(ps[k].p, 9, {x, t})
  end
  local same = true
  for s = 1, 6 do
    for _, q in ipairs(ps) do
      if s == 3 then q.p:set(q.x, 0 / 0, 1) end
      if s == 4 then T.set_random(q.p, 9, {q.x}) end
    end
    local la, ia = ps[1].p:step{lr = 1e-2 / s, guard = true}
    local lb, ib = ps[2].p:step{lr = 1e-2 / s, guard = true}
    same = same and (la == lb or la ~= la and lb ~= lb) and ia.skipped == ib.skipped and (s ~= 3 or ia.skipped)
  end
  for _, name in ipairs(ps[1].p:state_tensors()) do
    same = same and ps[1].p:checksum(name) == ps[2].p:checksum(name)
  end
  -- a launch for forward and backward each step, for the sums each step not
  -- skipped, for the update each step that updates
  local want = opt.accumulate and 6 + 5 + 2 or 6 + 5
  T.ok(same and ps[1].p:graphs().launches == want, string.format("%s%s: 6 guarded steps (a NaN skipped) replayed " ..
    "bitwise as op by op (%d launches)", opt.optimizer, opt.accumulate and " with accumulation and clipping" or "",
    ps[1].p:graphs().launches))
end

do
  -- profiling times each op (a sync after each): the lists run op by op
  -- meanwhile; and a program compiled with cuda_graph = false launches none
  local g, c, x, t = T.mlp(4, {lr = 1e-2, device = "cuda"})
  local p = g:compile(c)
  T.set_random(p, 9, {x, t})
  p:step()
  local g0, l0 = p:graphs(), launches()
  p:step()
  local g1 = p:graphs()
  p:profile(true)
  p:step()
  local prof = p:profile()
  p:profile(false)
  local g2, l2 = p:graphs(), launches()
  T.ok(g1.launches - g0.launches == 2 and g2.launches == g1.launches and g2.op_by_op == g1.op_by_op + 2 and
    next(prof) ~= nil and (not log or l2 - l0 == 2), string.format(
    "a step is two launches (%d); a profiled step runs op by op (%d ranges) and times its ops",
    g1.launches - g0.launches, g2.op_by_op - g1.op_by_op))
  c.cuda_graph = false
  local q = g:compile(c)
  T.set_random(q, 9, {x, t})
  q:step()
  q:forward()
  T.ok(q:graphs().launches == 0 and q:graphs().captures == 0 and launches() == l2,
    "compile{cuda_graph = false}: no graph is captured or launched")
end

-- mixed precision replayed: bf16 (products and convolutions on their bf16
-- kernels: cuBLASLt and cuDNN calls captured) and fp16 with its loss scale
-- (the scale an optimizer-state tensor, its inverse an input the step writes)
for _, prec in ipairs{"bf16", "fp16"} do
  local function mixed(graph)
    local _, p = T.unet_step(config, shape, {optimizer = "adamw", lr = 1e-3, seed = 5, device = "cuda",
      cuda_graph = graph, precision = prec})
    return p
  end
  local qg, qe = mixed(true), mixed(false)
  local same_l = true
  local before_last
  for s = 1, 3 do
    if s == 3 then before_last = qg:graphs() end
    local lg2 = qg:step{lr = 1e-3 / s}
    local le2 = qe:step{lr = 1e-3 / s}
    same_l = same_l and lg2 == le2
  end
  -- a range refused at its first capture for a convolution's algorithm
  -- search (done op by op, outside any capture) is captured at a later run:
  -- by the fourth step every range replays
  local last = qg:graphs()
  T.ok(last.op_by_op == before_last.op_by_op and last.launches > before_last.launches, string.format(
    "%s: the fourth step replays every range (%d ranges op by op before it, %d after)", prec,
    before_last.op_by_op, last.op_by_op))
  local diff = 0
  for _, name in ipairs(qg:state_tensors()) do
    if qg:checksum(name) ~= qe:checksum(name) then diff = diff + 1 end
  end
  T.ok(same_l and diff == 0 and qg:graphs().launches > 0, string.format(
    "%s: 3 steps replayed as graphs (%d launches) give op by op's losses, weights and optimizer state bitwise " ..
    "(%d tensors differ)", prec, qg:graphs().launches, diff))
end

T.done()
