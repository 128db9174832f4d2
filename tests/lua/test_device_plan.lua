-- Devices as scripts see them, and plans for the GPU made on any machine:
-- compile{device = "cuda", plan_only = true} plans with the CUDA backend's
-- workspace rules and bf16 kernels whether or not a GPU is present; without
-- one, running on cuda is refused with one error naming the line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local devices = table.concat(ck.devices(), ",")
T.ok(devices == "cpu" or devices == "cpu,cuda", "ck.devices() lists the CPU, then cuda where usable: " .. devices)
T.ok(ck.device == "cpu" or ck.device == "cuda", "ck.device names the default: " .. tostring(ck.device))

local function attention_plan(device, storage)
  local g = ck.graph()
  local q = g:input("q", {1, 4096, 512})
  local kv = g:input("kv", {1, 4096, 512})
  local o = ck.attention(q, kv, kv, 8)
  local y = ck.silu(o)
  return g:compile{outputs = {y}, plan_only = true, device = device, storage = storage}
end

do
  local pc, pg = attention_plan("cpu"), attention_plan("cuda")
  local name, fixed = pg:device()
  T.ok(name == "cuda" and fixed == 6 * 2 ^ 20,
    string.format("a plan for cuda holds cuBLAS's workspace and the reduction scratch outside the plan, " ..
      "in one allocation of whole 2 MiB pages (%d bytes)", fixed))
  T.ok(select(2, pc:device()) == 0, "a plan for the CPU holds nothing outside it")
  local page = select(3, pg:device())
  T.ok(page == 2 ^ 21 and pg:plan().arena == 32 * 2 ^ 20 and pg:plan().device_bytes == pg:plan().arena + fixed,
    string.format("on cuda a program takes its arena (32 MiB: whole 2 MiB pages) and the fixed bytes: %d",
      pg:plan().device_bytes))
  local g = ck.graph()
  local small = g:compile{outputs = {ck.silu(g:input("x", {3, 1000}))}, plan_only = true, device = "cuda"}:plan()
  T.ok(small.arena < 2 ^ 16 and small.device_bytes == 2 ^ 21 + fixed,
    string.format("an arena of %d bytes takes a whole 2 MiB page: %d bytes with the fixed ones", small.arena,
      small.device_bytes))
  T.ok(select(3, pc:device()) == 1 and pc:plan().device_bytes == pc:plan().arena,
    "on the CPU it takes the arena: " .. pc:plan().device_bytes)
  T.ok(pc:plan().workspace > 0 and pg:plan().workspace == 0,
    string.format("fused attention on the GPU takes no workspace (the CPU's takes %d bytes)", pc:plan().workspace))
  local ok, err = pcall(function() return pg:forward() end)
  T.ok(not ok and err:match("planning only"), "a plan-only program does not run: " .. tostring(err))
end

do -- a convolution's workspace: one image's im2col columns on the CPU; on the GPU the algorithm chosen for
  -- the shape on a device, and without one the stated rule: the columns, at most 32 MiB
  local function plan(device, c, o, side)
    local g = ck.graph()
    local x = g:input("x", {1, c, side, side})
    local w = g:input("w", {o, c, 3, 3})
    return g:compile{outputs = {ck.conv2d(x, w, nil, {padding = 1})}, plan_only = true, device = device}:plan()
  end
  -- two trained convolutions: forward, both filter gradients and the second's data gradient
  local function trained(storage)
    local g = ck.graph()
    local x = g:input("x", {2, 16, 12, 12})
    local h = ck.conv2d(x, g:param("a.weight", {8, 16, 3, 3}), g:param("a.bias", {8}), {padding = 1})
    local y = ck.conv2d(ck.silu(h), g:param("b.weight", {4, 8, 3, 3}), nil, {stride = 2, padding = 1})
    local p = g:compile{loss = ck.mean(ck.mul(y, y)), optimizer = "none", keep_grads = true, plan_only = true,
      device = "cuda", storage = storage}
    return p:plan(), p:graph()
  end
  local cpu, gpu = plan("cpu", 960, 320, 128).workspace, plan("cuda", 960, 320, 128)
  local cap = 256 * 2 ^ 20 -- CK_CUDA_CONV_WS_CAP
  if gpu.conv_rule == "stated" then
    T.ok(cpu == 960 * 9 * 128 * 128 * 4 and gpu.conv_workspace_max == 32 * 2 ^ 20,
      string.format("conv 960->320 3x3 @128x128: workspace %d bytes on the CPU, %d on the GPU (the stated rule)", cpu,
        gpu.conv_workspace_max))
    local small = plan("cuda", 8, 8, 16).conv_workspace_max
    T.ok(small == 8 * 9 * 16 * 16 * 4, "a small convolution gets all its columns on the GPU too: " .. small)
  else
    T.ok(gpu.conv_rule == "chosen" and gpu.conv_workspace_max <= cap, string.format(
      "conv 960->320 3x3 @128x128 on this device: the chosen algorithms take at most %d bytes (cap %d)",
      gpu.conv_workspace_max, cap))
  end
  -- the report's figures are the plan's own: the convolutions' workspaces, summed and the largest
  for _, storage in ipairs{"fp32", "bf16"} do
    local pl, graph = trained(storage ~= "fp32" and storage or nil)
    local sum, max, n = 0, 0, 0
    for _, op in ipairs(graph.ops) do
      if op.op:match("^conv2d") then
        sum, max, n = sum + op.workspace_bytes, math.max(max, op.workspace_bytes), n + 1
      end
    end
    T.ok(n == 5 and pl.conv_workspace == sum and pl.conv_workspace_max == max and (pl.conv_rule ~= "stated" or max > 0),
      string.format("%s on cuda (%s): %d convolution entries, workspace %d in all (the ops' %d), the largest %d", storage,
        pl.conv_rule, n, pl.conv_workspace, sum, pl.conv_workspace_max))
  end
end

do -- bf16 (inputs stay fp32): both devices have bf16 silu kernels; scale reads an fp32 input
  local g = ck.graph()
  local x = g:input("x", {64, 1024})
  local y = ck.silu(ck.silu(ck.scale(x, 2)))
  local function ws(device)
    return g:compile{outputs = {y}, plan_only = true, device = device, storage = "bf16"}:plan().workspace
  end
  local n = 64 * 1024 * 4
  T.ok(ws("cpu") == n and ws("cuda") == n,
    string.format("bf16 activations: the silus need no fp32 copies on either device; scale, from an fp32 input, "
      .. "writes its bf16 output through one (%d bytes on the CPU, %d on the GPU)", ws("cpu"), ws("cuda")))
end

do -- a product of a bf16 activation and an fp32 (trainable) weight runs in bf16, as under PyTorch's autocast,
  -- on a bf16 copy of the weight: on the GPU plus cuBLASLt's workspace (4 bytes per output element); on the
  -- CPU plus the fp32 copies its bf16 kernel widens every operand into
  local g = ck.graph()
  local h = ck.silu(g:input("x", {64, 32}))
  local y = ck.linear(h, g:param("l.weight", {16, 32}))
  local function ws(device)
    for _, op in ipairs(g:compile{outputs = {y}, plan_only = true, device = device, storage = "bf16"}:graph().ops) do
      if op.op == "linear" then return op.workspace_bytes end
    end
  end
  local cast = 16 * 32 * 2
  T.ok(ws("cuda") == cast + 64 * 16 * 4 and ws("cpu") == cast + (64 * 32 + 16 * 32 + 64 * 16) * 4, string.format(
    "bf16 x fp32 weight: %d bytes of workspace on the GPU (a bf16 weight and cuBLASLt's), %d on the CPU (a bf16 " ..
    "weight and the fp32 copies)", ws("cuda"), ws("cpu")))
end

do -- bf16: the GPU's attention reads and writes bf16 (tensor cores); the CPU's converts around its fp32 kernel
  local g = ck.graph()
  local x = g:input("x", {1, 256, 128})
  local q = ck.silu(x)
  local y = ck.attention(q, q, q, 2)
  local function ws(device)
    return g:compile{outputs = {y}, plan_only = true, device = device, storage = "bf16"}:plan().workspace
  end
  local n = 256 * 128 * 4
  T.ok(ws("cuda") == n and ws("cpu") >= 4 * n,
    string.format("bf16 attention: no fp32 copies on the GPU, only silu's from an fp32 input (%d bytes); "
      .. "on the CPU copies of q, k, v and o and its scores (%d bytes)", ws("cuda"), ws("cpu")))
end

if not devices:match("cuda") then
  local g = ck.graph()
  local x = g:input("x", {2, 2})
  local ok, err = pcall(function() return g:compile{outputs = {ck.silu(x)}, device = "cuda"} end)
  T.ok(not ok and err:match("test_device_plan%.lua:%d+:") and err:match("CUDA"),
    "without a GPU, running on cuda is refused, naming the line: " .. tostring(err))
end

T.done()
