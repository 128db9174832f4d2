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

do -- a convolution's workspace: one image's im2col columns on the CPU, at most 32 MiB on the GPU
  local function ws(device, c, o, side)
    local g = ck.graph()
    local x = g:input("x", {1, c, side, side})
    local w = g:input("w", {o, c, 3, 3})
    return g:compile{outputs = {ck.conv2d(x, w, nil, {padding = 1})}, plan_only = true, device = device}:plan().workspace
  end
  local cpu, gpu = ws("cpu", 960, 320, 128), ws("cuda", 960, 320, 128)
  T.ok(cpu == 960 * 9 * 128 * 128 * 4 and gpu == 32 * 2 ^ 20,
    string.format("conv 960->320 3x3 @128x128: workspace %d bytes on the CPU, %d on the GPU", cpu, gpu))
  local small = ws("cuda", 8, 8, 16)
  T.ok(small == 8 * 9 * 16 * 16 * 4, "a small convolution gets all its columns on the GPU too: " .. small)
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
