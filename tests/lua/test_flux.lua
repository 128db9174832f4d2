-- Flux.1's transformer in ck.flux against diffusers' FluxTransformer2DModel
-- (tests/ref/make_flux_ref.py): parameter names, shapes and counts of the
-- tiny, dev and schnell configs; flux-tiny's forward, its full gradients and a
-- LoRA's gradients against autograd; the 2x2 packing; the rope table's
-- positions; bad configs and inputs; flux-dev's LoRA step planned at 512 px.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local flux = require "ck.flux"
local lora = require "ck.lora"

local REF = "tests/data/flux/"

-- "name [d0,d1,...]" per line -> {name = "d0,d1,..."}, count
local function read_keys(path)
  local keys, n = {}, 0
  for line in io.lines(path) do
    local name, shape = line:match("^(%S+)%s+%[([%d,]*)%]%s*$")
    if name then
      keys[name] = shape
      n = n + 1
    end
  end
  return keys, n
end

-- the first differences between a graph's parameters and a key list, or nil
local function diff_keys(g, path)
  local want, nwant = read_keys(path)
  local have, nhave = {}, 0
  for _, p in ipairs(g:params()) do
    have[p.name] = table.concat(p.shape, ",")
    nhave = nhave + 1
  end
  local diffs = {}
  local function note(s) if #diffs < 5 then diffs[#diffs + 1] = s end end
  for name, shape in pairs(want) do
    if not have[name] then note("missing " .. name)
    elseif have[name] ~= shape then note(name .. " is [" .. have[name] .. "], want [" .. shape .. "]") end
  end
  for name in pairs(have) do if not want[name] then note("unexpected " .. name) end end
  if nwant ~= nhave then note(string.format("%d parameters, want %d", nhave, nwant)) end
  table.sort(diffs)
  return #diffs > 0 and table.concat(diffs, "; ") or nil
end

-- max |got - want| over max |want|
local function worst(got, want)
  local e, m = 0, 0
  for i = 1, #want do e, m = math.max(e, math.abs(got[i] - want[i])), math.max(m, math.abs(want[i])) end
  return #got == #want and e / m or math.huge
end

do -- the full configs: graphs recorded, never compiled or allocated
  local t0 = os.clock()
  for _, v in ipairs{{"flux-dev", 11901408320, "flux_dev_keys.txt"}, {"flux-schnell", 11891178560, "flux_schnell_keys.txt"}} do
    local g = ck.graph()
    local _, y = flux.build(g, v[1], {height = 4, width = 4, tokens = 2})
    local n = g:param_count()
    T.ok(n == v[2], string.format("%s has %d parameters (got %d)", v[1], v[2], n))
    local d = diff_keys(g, REF .. v[3])
    T.ok(d == nil, v[1] .. "'s parameter names and shapes are diffusers' (" .. v[3] .. ")" .. (d and (": " .. d) or ""))
    T.ok(table.concat(y.shape, ",") == "1,4,64", v[1] .. " maps 4 packed tokens to [1, 4, 64]")
  end
  T.ok(os.clock() - t0 < 5, string.format("both full graphs recorded in %.2fs", os.clock() - t0))
end

do -- flux-tiny's names and shapes are those diffusers saved (the folder's index)
  local g = ck.graph()
  flux.build(g, "flux-tiny", {height = 4, width = 6, tokens = 5})
  local index = ck.json_decode(io.open(REF .. "transformer/diffusion_pytorch_model.safetensors.index.json"):read("a"))
  local want, n = {}, 0
  for k in pairs(index.weight_map) do want[k], n = true, n + 1 end
  local have, bad = 0, nil
  for _, p in ipairs(g:params()) do
    have = have + 1
    if not want[p.name] then bad = bad or p.name end
  end
  T.ok(n == 112 and have == n and not bad, "flux-tiny has diffusers' 112 tensors" .. (bad and (", not " .. bad) or ""))
  T.ok(g:param_count() == 134784, "flux-tiny has 134,784 parameters (got " .. g:param_count() .. ")")
end

-- flux-tiny on the reference inputs: latents packed in the graph, the
-- transformer, its output unpacked, the mean squared error against a target.
-- grads: the inputs latents, encoder_hidden_states and pooled_projections
-- as trainable leaves (so that they get gradients).
local function tiny_graph(f, opts)
  opts = opts or {}
  local g = ck.graph()
  local c = flux.config("flux-tiny")
  local model = flux.FluxTransformer2DModel(c)
  local leaf = opts.grads and function(name) local t = g:param(name, f:shape(name), {init = "zeros"}); return t end
    or function(name) local t = g:input(name, f:shape(name)); return t end
  local x = {latents = leaf("latents"), encoder_hidden_states = leaf("encoder_hidden_states"),
             pooled_projections = leaf("pooled_projections"), timestep = g:input("timestep", {2}),
             guidance = g:input("guidance", {2}), rope = g:input("rope", {5 + 6, 16}), target = g:input("target", {2, 16, 4, 6})}
  if opts.frozen then model:freeze() end
  local adapter = opts.lora and lora.attach(model, {rank = 4, alpha = 8, targets = flux.LORA_TARGETS})
  local packed = flux.pack(x.latents)
  local y = model:forward(g, packed, x.encoder_hidden_states, x.pooled_projections, x.timestep, x.rope, x.guidance)
  local un = flux.unpack(y, 4, 6)
  local loss = ck.mse_loss(un, x.target)
  local p = g:compile{loss = loss, outputs = {y, un, packed}, optimizer = "none", keep_grads = true}
  for _, k in ipairs{"latents", "encoder_hidden_states", "pooled_projections", "timestep", "guidance", "target"} do
    p:set(x[k], f:read(k))
  end
  p:set(x.rope, flux.rope_values(c, 5, 4, 6))
  require("ck.flux_keys").load(p, require("ck.flux_keys").open(REF .. "transformer"),
    (function() local l = {} for _, t in ipairs(g:params()) do if not t.name:find("lora_") and not x[t.name] then l[#l + 1] = t end end return l end)())
  return {g = g, p = p, x = x, y = y, un = un, packed = packed, loss = loss, model = model, adapter = adapter}
end

do -- forward and every gradient against autograd
  local f <close> = ck.safetensors(REF .. "ref.safetensors")
  local t0 = os.clock()
  local r = tiny_graph(f, {grads = true})
  local loss = r.p:step()
  T.ok(worst(r.p:get(r.packed), f:read("packed")) == 0, "flux.pack is diffusers' _pack_latents, exactly")
  local e = worst(r.p:get(r.y), f:read("out"))
  T.ok(e < 1e-5, string.format("flux-tiny's output is diffusers' to fp32 rounding (worst %.2g of the largest)", e))
  e = worst(r.p:get(r.un), f:read("out_unpacked"))
  T.ok(e < 1e-5, string.format("flux.unpack is diffusers' _unpack_latents (worst %.2g)", e))
  local want = f:read("loss")[1]
  T.ok(math.abs(loss - want) < 1e-5 * want, string.format("the loss is autograd's (%.7g, want %.7g)", loss, want))
  local bad, n, we = nil, 0, 0
  for _, t in ipairs(r.g:params()) do
    local err = worst(r.p:grad(t), f:read("grad/" .. t.name))
    n, we = n + 1, math.max(we, err)
    if err > 1e-4 and not bad then bad = string.format("%s (worst %.2g)", t.name, err) end
  end
  T.ok(n == 115 and not bad, string.format("the gradients of the 3 inputs and 112 parameters are autograd's (worst %.2g)%s",
    we, bad and (": not " .. bad) or ""))
  T.ok(os.clock() - t0 < 2, string.format("compiled, loaded and stepped in %.2fs", os.clock() - t0))
end

do -- a LoRA on diffusers' targets: names, forward and gradients against PEFT's
  local f <close> = ck.safetensors(REF .. "ref.safetensors")
  local r = tiny_graph(f, {frozen = true, lora = true})
  local want = {}
  for _, k in ipairs(f:keys()) do
    local m = k:match("^lora/(.+)%.lora_A%.weight$")
    if m then want[m] = true end
  end
  local same, n = true, 0
  for _, path in ipairs(r.adapter.paths) do
    same, n = same and want[path] == true, n + 1
    want[path] = nil
  end
  T.ok(same and n == 30 and next(want) == nil,
    "flux.LORA_TARGETS adapt the 30 modules PEFT adapts for diffusers' Flux LoRA targets (" .. n .. ")")
  for _, ad in ipairs(r.adapter.adapters) do
    r.p:set(ad.down, f:read("lora/" .. ad.path .. ".lora_A.weight"))
    r.p:set(ad.up, f:read("lora/" .. ad.path .. ".lora_B.weight"))
  end
  local loss = r.p:step()
  local e = worst(r.p:get(r.y), f:read("lora_out"))
  T.ok(e < 1e-5, string.format("with the adapter, the output is PEFT's (worst %.2g)", e))
  local lw = f:read("lora_loss")[1]
  T.ok(math.abs(loss - lw) < 1e-5 * lw, string.format("the loss is PEFT's (%.7g, want %.7g)", loss, lw))
  local bad, we = nil, 0
  for _, ad in ipairs(r.adapter.adapters) do
    for k, name in pairs{lora_A = ad.down, lora_B = ad.up} do
      local err = worst(r.p:grad(name), f:read("lora_grad/" .. ad.path .. "." .. k .. ".weight"))
      we = math.max(we, err)
      if err > 1e-4 and not bad then bad = string.format("%s (worst %.2g)", name, err) end
    end
  end
  T.ok(not bad, string.format("the 60 LoRA factors' gradients are autograd's (worst %.2g)%s", we,
    bad and (": not " .. bad) or ""))
  local frozen = 0
  for _, t in ipairs(r.g:params()) do if t.kind == "frozen" then frozen = frozen + 1 end end
  T.ok(frozen == 112, "the base's 112 tensors are frozen (" .. frozen .. ")")
end

do -- the joint sequence's positions: text at (0, 0, 0), then image (0, row, col) row-major
  local ids = flux.ids(2, 4, 6)
  local s = {}
  for _, id in ipairs(ids) do s[#s + 1] = table.concat(id, ",") end
  T.ok(table.concat(s, " ") == "0,0,0 0,0,0 0,0,0 0,0,1 0,0,2 0,1,0 0,1,1 0,1,2",
    "flux.ids: 2 text tokens, then 2x3 patches of 4x6 latents (diffusers' txt_ids, _prepare_latent_image_ids)")
  local f <close> = ck.safetensors(REF .. "ref.safetensors")
  local img, txt = f:read("img_ids"), f:read("txt_ids")
  local ok = true
  for l = 1, 6 do
    for a = 1, 3 do ok = ok and ids[2 + l][a] == img[3 * (l - 1) + a] end
  end
  for i = 1, #txt do ok = ok and txt[i] == 0 end
  T.ok(ok, "flux.ids' image positions are the reference's img_ids")
end

do -- bad configs and inputs: one line naming the key or the shape, with this script's line
  local bad = {
    {function() local c = flux.config("flux-pro"); return c end, "unknown Flux config 'flux%-pro'"},
    {function() local c = flux.config{num_layers = 2, num_single_layers = 1, attention_head_dim = 16,
      num_attention_heads = 2, in_channels = 64, joint_attention_dim = 8, pooled_projection_dim = 8,
      axes_dims_rope = {4, 6, 4}}; return c end, "key 'axes_dims_rope' %[4,6,4%] sums to 14, not attention_head_dim 16"},
    {function() local c = flux.config("flux-tiny"); c.patch_size = 2; local r = flux.config(c); return r end, "key 'patch_size' is 2"},
    {function() local c = flux.config("flux-tiny"); c.num_layers = -1; local r = flux.config(c); return r end,
     "key 'num_layers' must be a whole number >= 0, got %-1"},
    {function() local c = flux.config("flux-tiny"); c.qk_norm = "rms"; local r = flux.config(c); return r end,
     "key 'qk_norm' is not one ck.flux builds from"},
    {function() local c = flux.config("flux-tiny"); c.guidance_embeds = "yes"; local r = flux.config(c); return r end,
     "key 'guidance_embeds' must be true or false"},
    {function() local g = ck.graph(); local x = flux.inputs(g, "flux-tiny", {height = 5}); return x end, "height must be a whole number >= 2 and even"},
    {function()
      local g = ck.graph()
      local x = flux.inputs(g, "flux-tiny", {height = 4, width = 4, tokens = 3})
      local y = flux.FluxTransformer2DModel("flux-tiny"):forward(g, x.hidden_states, x.encoder_hidden_states,
        x.pooled_projections, x.timestep, g:input("r", {6, 16}), x.guidance)
      return y
    end, "the rope table must be %[7, 16%] %(3 text and 4 image tokens%), got %[6, 16%]"},
    {function()
      local g = ck.graph()
      local x = flux.inputs(g, "flux-tiny", {height = 2, width = 2, tokens = 1})
      local y = flux.FluxTransformer2DModel("flux-tiny"):forward(g, x.hidden_states, x.encoder_hidden_states,
        x.pooled_projections, x.timestep, x.rope)
      return y
    end, "this model embeds guidance %(as flux%-dev%): give a guidance input"},
    {function() local g = ck.graph(); local y = flux.pack(g:input("l", {1, 16, 3, 4})); return y end, "H and W even, got %[1, 16, 3, 4%]"},
    {function() local g = ck.graph(); local y = flux.unpack(g:input("t", {1, 6, 64}), 4, 4); return y end, "are not 4x4 latents packed 2x2"},
  }
  for i, c in ipairs(bad) do
    local ok, err = pcall(c[1])
    err = tostring(err)
    T.ok(not ok and err:find(c[2]) and err:find("test_flux.lua:%d+:") and not err:find("\n"),
      "bad input " .. i .. " refused in one line: " .. err)
  end
end

do -- ck.flux_step.training_step on flux-tiny: packing, the transformer, unpacking and the flow-matching loss wired as
   -- diffusers' recipe; at sigma 0 the model sees the clean latents and the target is noise - latents
  local f <close> = ck.safetensors(REF .. "ref.safetensors")
  local r = require("ck.flux_step").training_step{config = "flux-tiny", batch = 2, latent = {4, 6}, tokens = 5, lora = {rank = 4},
    compile = {lr = 1e-2, keep_grads = true}}
  local fk = require "ck.flux_keys"
  local base = {}
  for _, t in ipairs(r.graph:params()) do if t.kind == "frozen" then base[#base + 1] = t end end
  fk.load(r.program, fk.open(REF .. "transformer"), base)
  local p, x = r.program, r.inputs
  local lat, tgt = f:read("latents"), f:read("target")
  local noise = {}
  for i = 1, #lat do noise[i] = lat[i] + tgt[i] end
  for _, k in ipairs{"encoder_hidden_states", "pooled_projections", "guidance"} do p:set(x[k], f:read(k)) end
  p:set(x.rope, r.rope_values)
  p:set(x.latents, lat)
  p:set(x.noise, noise)
  p:set(x.timesteps, f:read("timestep"))
  p:set(x.sigma, {0, 0})
  p:set(x.weight, {1, 1})
  local loss = p:forward()
  local want = f:read("loss")[1]
  T.ok(math.abs(loss - want) < 1e-5 * want,
    string.format("at sigma 0 the step's loss is the reference transformer's mse against noise - latents (%.7g, want %.7g)",
      loss, want))
  local first = p:step()
  local last
  for _ = 1, 4 do last = p:step() end
  T.ok(last < first, string.format("five LoRA steps on one batch lower the loss (%.5g -> %.5g)", first, last))
end

do -- flux-dev's LoRA step at 512 px in bf16 (64x64 latents, 512 T5 tokens), planned only
  local t0 = os.clock()
  local policy = require "ck.policy"
  local r = require("ck.flux_step").training_step{config = "flux-dev", batch = 1, latent = 64, tokens = 512, lora = {rank = 16},
    compile = {precision = "bf16", plan_only = true, checkpoint = policy.blocks(flux.BLOCKS)}}
  local plan = r.program:plan()
  local all, train = r.graph:param_count()
  T.ok(all - train == 11901408320 and train == r.adapter.param_count(),
    string.format("flux-dev LoRA rank 16: %d frozen and %d trainable parameters", all - train, train))
  T.ok(plan.arena > 11901408320 * 2 and plan.arena < 40 * 2 ^ 30,
    string.format("flux-dev LoRA at 512 px, bf16, blocks recomputed: planned arena %.2f GiB (in %.1fs)",
      plan.arena / 2 ^ 30, os.clock() - t0))
  T.ok(#r.rope_values == (512 + 1024) * 128, "the step's rope table covers 512 text and 1024 image tokens")
end

T.done()
