-- ck.flux_lora: kohya's Flux LoRA targets and file (the names ComfyUI maps onto
-- Black Forest Labs' modules), diffusers' layout, and both loading in diffusers
-- and ComfyUI at a strength (tests/ref/make_flux_lora_ref.py recorded the
-- outputs for the files ckrun wrote, tests/data/flux_lora); the shared lora_down
-- of BFL's fused modules against per-module adapters; loading back bitwise; the
-- refusals.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local flux = require "ck.flux"
local lora = require "ck.lora"
local flux_lora = require "ck.flux_lora"
local fx = require "flux_lora_fixture"

local KOHYA, PEFT = fx.DIR .. "kohya.safetensors", fx.DIR .. "peft.safetensors"

local tmp = string.format("out/test_flux_lora.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir("out")) -- a fresh clone has none
assert(ck.mkdir(tmp))
tmp = tmp .. "/"

local function read_bytes(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- max |got - want| over max |want|
local function worst(got, want)
  local e, m = 0, 0
  for i = 1, #want do e, m = math.max(e, math.abs(got[i] - want[i])), math.max(m, math.abs(want[i])) end
  return #got == #want and e / m or math.huge
end

local function same_values(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- rows first .. first+count-1 of a flat [rows, cols] list
local function rows(t, cols, first, count)
  local out = {}
  for i = (first - 1) * cols + 1, (first - 1 + count) * cols do out[#out + 1] = t[i] end
  return out
end

local function kohya_attach(extra)
  return function(model)
    local o = {rank = fx.RANK, alpha = fx.ALPHA}
    for k, v in pairs(extra or {}) do o[k] = v end
    return flux_lora.attach(model, o)
  end
end

local ref <close> = ck.safetensors(fx.DIR .. "ref.safetensors")

-- a copy of a file's tensors, edited: edit(list of {key, shape, values}, metadata) -> list, metadata
local function rewrite(src, dst, edit)
  local f <close> = ck.safetensors(src)
  local list = {}
  for _, k in ipairs(f:keys()) do list[#list + 1] = {k, f:shape(k), f:read(k)} end
  local meta = {}
  for k, v in pairs(f:metadata()) do meta[k] = v end
  list, meta = edit(list, meta)
  ck.write_safetensors(dst, list, meta)
  return dst
end

local function drop(key)
  return function(list, meta)
    local out = {}
    for _, e in ipairs(list) do if e[1] ~= key then out[#out + 1] = e end end
    return out, meta
  end
end

local function add(key, shape, values)
  return function(list, meta)
    list[#list + 1] = {key, shape, values}
    return list, meta
  end
end

do -- kohya's targets: every Linear of the double and single blocks, named as ComfyUI maps BFL's weights
  local bfl <close> = ck.safetensors(fx.REF .. "bfl.safetensors")
  local want, n = {}, 0
  for _, k in ipairs(bfl:keys()) do
    local s = bfl:shape(k)
    if (k:match("^double_blocks%.") or k:match("^single_blocks%.")) and k:match("%.weight$") and #s == 2 then
      want["lora_unet_" .. k:sub(1, -8):gsub("%.", "_")] = s
      n = n + 1
    end
  end
  local model = flux.FluxTransformer2DModel("flux-tiny")
  local h = flux_lora.attach(model, {rank = 4})
  local bad, fused = nil, {}
  for _, ad in ipairs(h.adapters) do
    local s = want[ad.kohya]
    if not s or s[1] ~= ad.out_features or s[2] ~= ad.in_features then bad = bad or ad.kohya end
    want[ad.kohya] = nil
    if #ad.parts > 1 then fused[#fused + 1] = ad.bfl .. "=" .. #ad.parts .. ":" .. ad.path end
  end
  T.ok(n == 26 and #h.adapters == 26 and not bad and next(want) == nil,
    "26 adapters, one for each Linear weight of flux-tiny's BFL blocks (modulation included), named lora_unet_<BFL "
    .. "key with underscores> and shaped as it" .. (bad and (": not " .. bad) or ""))
  T.ok(table.concat(fused, " ") == "double_blocks.0.img_attn.qkv=3:transformer_blocks.0.attn.to_qkv "
    .. "double_blocks.0.txt_attn.qkv=3:transformer_blocks.0.attn.to_added_qkv "
    .. "double_blocks.1.img_attn.qkv=3:transformer_blocks.1.attn.to_qkv "
    .. "double_blocks.1.txt_attn.qkv=3:transformer_blocks.1.attn.to_added_qkv "
    .. "single_blocks.0.linear1=4:single_transformer_blocks.0.to_qkv_mlp "
    .. "single_blocks.1.linear1=4:single_transformer_blocks.1.to_qkv_mlp",
    "qkv and linear1 are one adapter each over their 3 and 4 diffusers modules, held as to_qkv, to_added_qkv, to_qkv_mlp")
  T.ok(#h.paths == 40 and h.param_count() == 16384,
    string.format("they adapt 40 diffusers modules with %d parameters (rank 4 times in + out of each BFL module)",
      h.param_count()))
end

do -- the committed files are what ckrun writes, byte for byte; ComfyUI's key map takes every key of the kohya file
  fx.write(tmp)
  T.ok(read_bytes(tmp .. "kohya.safetensors") == read_bytes(KOHYA) and read_bytes(tmp .. "peft.safetensors") == read_bytes(PEFT),
    "the fixture's adapter saves as tests/data/flux_lora/kohya.safetensors and peft.safetensors, byte for byte")
  local bfl <close> = ck.safetensors(fx.REF .. "bfl.safetensors")
  local map = {} -- comfy/lora.py model_lora_keys_unet: every weight of the model, "diffusion_model." dropped
  for _, k in ipairs(bfl:keys()) do
    if k:match("%.weight$") then map["lora_unet_" .. k:sub(1, -8):gsub("%.", "_")] = k end
  end
  local f <close> = ck.safetensors(KOHYA)
  local taken, patched, bad = 0, 0, nil
  for _, k in ipairs(f:keys()) do
    local name, part = k:match("^(.-)%.(lora_up)%.weight$")
    if not name then name, part = k:match("^(.-)%.(lora_down)%.weight$") end
    if not name then name, part = k:match("^(.-)%.(alpha)$") end
    if name and map[name] then
      taken = taken + 1
      if part == "lora_up" then
        patched = patched + 1
        local w, u, d = bfl:shape(map[name]), f:shape(k), f:shape(name .. ".lora_down.weight")
        if not (u[1] == w[1] and d[2] == w[2] and u[2] == d[1] and #f:read(name .. ".alpha") == 1) then bad = bad or k end
      end
    else
      bad = bad or k
    end
  end
  T.ok(taken == #f:keys() and taken == 78 and patched == 26 and not bad,
    "ComfyUI's mapping loads every key of the kohya file: 26 weights patched by up [out, r] @ down [r, in] at alpha / r"
    .. (bad and (": not " .. bad) or ""))
  local m = f:metadata()
  T.ok(m.ss_network_module == "networks.lora_flux" and m.ss_base_model_version == "flux1" and m.ss_network_dim == "4"
    and m.ss_network_alpha == "2" and m.ss_network_args == "{}" and m["modelspec.architecture"] == "flux-1/lora"
    and m["modelspec.implementation"] == "https://github.com/black-forest-labs/flux" and m.lora_adapter_metadata == nil,
    "kohya's metadata: networks.lora_flux, flux1, dim 4, alpha 2, ModelSpec flux-1/lora")
  local dev, schnell = flux.config("flux-dev"), flux.config("flux-schnell")
  T.ok(flux_lora.architecture(dev) == "flux-1-dev" and flux_lora.architecture(schnell) == "flux-1-schnell"
    and flux_lora.architecture(flux.config("flux-tiny")) == "flux-1",
    "ModelSpec architecture: kohya's flux-1-dev and flux-1-schnell, flux-1 for other configs")
  local pf <close> = ck.safetensors(PEFT)
  local meta = ck.json_decode(pf:metadata().lora_adapter_metadata)
  local targets = {}
  for _, t in ipairs(meta["transformer.target_modules"]) do targets[#targets + 1] = t end
  T.ok(#pf:keys() == 80 and meta["transformer.r"] == 4 and meta["transformer.lora_alpha"] == 2
    and table.concat(targets, " ") == "norm1.linear attn.to_q attn.to_k attn.to_v attn.to_out.0 ff.net.0.proj "
      .. "ff.net.2 norm1_context.linear attn.add_q_proj attn.add_k_proj attn.add_v_proj attn.to_add_out "
      .. "ff_context.net.0.proj ff_context.net.2 proj_mlp single_transformer_blocks.0.proj_out norm.linear "
      .. "single_transformer_blocks.1.proj_out",
    "the PEFT file: lora_A and lora_B of the 40 modules, r 4, lora_alpha 2, target_modules naming exactly them "
    .. "(the single blocks' proj_out by path: the name would reach the model's proj_out too)")
end

do -- read back bitwise: either file into kohya's targets gives the same parameters, and saves the files again
  local fk <close> = ck.safetensors(KOHYA)
  local fp <close> = ck.safetensors(PEFT)
  local a = fx.graph(kohya_attach())
  local b = fx.graph(kohya_attach())
  T.ok(flux_lora.load(a.p, a.adapter, KOHYA) == "kohya" and flux_lora.load(b.p, b.adapter, PEFT) == "peft",
    "load finds each file's layout")
  local bad
  for _, ad in ipairs(a.adapter.adapters) do
    local d, u = a.p:get(ad.down), a.p:get(ad.up)
    if not (same_values(d, fk:read(ad.kohya .. ".lora_down.weight")) and same_values(u, fk:read(ad.kohya .. ".lora_up.weight"))
      and same_values(d, b.p:get(ad.down)) and same_values(u, b.p:get(ad.up))) then bad = bad or ad.path end
    for _, part in ipairs(ad.parts) do
      local name = "transformer." .. part.path
      if not (same_values(d, fp:read(name .. ".lora_A.weight"))
        and same_values(rows(u, ad.rank, part.first, part.count), fp:read(name .. ".lora_B.weight"))) then
        bad = bad or part.path
      end
    end
  end
  T.ok(not bad, "every parameter is the kohya file's tensor, and the PEFT file's lora_A of each part and lora_B rows, "
    .. "bitwise" .. (bad and (": not " .. bad) or ""))
  flux_lora.save(b.p, b.adapter, tmp .. "again_kohya.safetensors", {title = "flux-tiny fixture"})
  flux_lora.save(a.p, a.adapter, tmp .. "again_peft.safetensors", {format = "peft"})
  T.ok(read_bytes(tmp .. "again_kohya.safetensors") == read_bytes(KOHYA) and
    read_bytes(tmp .. "again_peft.safetensors") == read_bytes(PEFT),
    "loaded from the PEFT file and saved as kohya's, and the reverse, the files come out byte for byte")
end

do -- the forward with either file at strength 0.7: diffusers' load_lora_weights and ComfyUI's patch
  local base = fx.graph()
  base.p:forward()
  local e = worst(base.p:get(base.y), ref:read("base"))
  T.ok(e < 1e-5, string.format("without an adapter, flux-tiny is the reference's (worst %.2g)", e))
  for _, case in ipairs{{KOHYA, 0.7, "diffusers_kohya"}, {PEFT, 0.7, "diffusers_peft"}, {KOHYA, 0.7, "comfyui_kohya"},
                        {KOHYA, 1.0, "diffusers_kohya_1"}} do
    local r = fx.graph(kohya_attach{strength = case[2], trainable = false})
    flux_lora.load(r.p, r.adapter, case[1])
    r.p:forward()
    e = worst(r.p:get(r.y), ref:read(case[3]))
    T.ok(e < 1e-5, string.format("%s at strength %g is %s's output (worst %.2g of the largest)", case[1], case[2],
      case[3], e))
  end
  e = worst(ref:read("diffusers_kohya"), ref:read("base"))
  T.ok(e > 0.1, string.format("the reference's adapter moves the output (by %.2g of the largest)", e))
end

do -- generation: the adapter a file holds, either layout, at a strength; two files at once under prefixes
  local k = fx.graph(function(model) return flux_lora.attach(model, {from = KOHYA, strength = 0.7}) end)
  flux_lora.load(k.p, k.adapter, KOHYA)
  k.p:forward()
  local p = fx.graph(function(model) return flux_lora.attach(model, {from = PEFT, strength = 0.7}) end)
  flux_lora.load(p.p, p.adapter, PEFT)
  p.p:forward()
  local ek, ep = worst(k.p:get(k.y), ref:read("diffusers_kohya")), worst(p.p:get(p.y), ref:read("diffusers_peft"))
  T.ok(#k.adapter.adapters == 26 and #p.adapter.adapters == 40 and ek < 1e-5 and ep < 1e-5 and k.adapter.alpha == 2
    and p.adapter.alpha == 2 and not k.adapter.trainable,
    string.format("from = file: kohya's 26 modules and diffusers' 40 at the files' rank 4 and alpha 2, frozen, give "
      .. "diffusers' outputs (worst %.2g, %.2g)", ek, ep))
  local two = fx.graph(function(model)
    local a = flux_lora.attach(model, {from = KOHYA, strength = 0.7, prefix = "lora1."})
    local b = flux_lora.attach(model, {from = PEFT, strength = 0.3, prefix = "lora2."})
    return {a, b}
  end)
  flux_lora.load(two.p, two.adapter[1], KOHYA)
  flux_lora.load(two.p, two.adapter[2], PEFT)
  two.p:forward()
  local e = worst(two.p:get(two.y), ref:read("diffusers_kohya_1"))
  T.ok(e < 1e-5 and two.adapter[1].adapters[1].down == "transformer_blocks.0.norm1.linear.lora1.lora_down.weight",
    string.format("the same adapter from both files at 0.7 and 0.3 (prefixes lora1., lora2.) is it at 1.0 (worst %.2g)", e))
end

do -- training: the fused modules' shared down and stacked up are per-module adapters with copied downs
  local target = ref:read("base")
  local fused = fx.graph(kohya_attach(), {loss = target})
  fx.set_values(fused.p, fused.adapter)
  local paths = {}
  for _, path in ipairs(fused.adapter.paths) do paths[#paths + 1] = path end
  local per = fx.graph(function(model) return flux_lora.attach(model, {rank = fx.RANK, alpha = fx.ALPHA, targets = paths}) end,
    {loss = target})
  local by = {}
  for _, ad in ipairs(per.adapter.adapters) do by[ad.path] = ad end
  for _, ad in ipairs(fused.adapter.adapters) do
    local d, u = fused.p:get(ad.down), fused.p:get(ad.up)
    for _, part in ipairs(ad.parts) do
      per.p:set(by[part.path].down, d)
      per.p:set(by[part.path].up, rows(u, ad.rank, part.first, part.count))
    end
  end
  local l1, l2 = fused.p:step(), per.p:step()
  local e = worst(fused.p:get(fused.y), per.p:get(per.y))
  local bad, we = nil, 0
  for _, ad in ipairs(fused.adapter.adapters) do
    local gd, gu = fused.p:grad(ad.down), fused.p:grad(ad.up)
    local sum = {}
    for i = 1, #gd do sum[i] = 0 end
    for _, part in ipairs(ad.parts) do
      local pd = per.p:grad(by[part.path].down)
      for i = 1, #pd do sum[i] = sum[i] + pd[i] end
      local eu = worst(rows(gu, ad.rank, part.first, part.count), per.p:grad(by[part.path].up))
      we = math.max(we, eu)
      if eu > 1e-5 then bad = bad or (part.path .. " up") end
    end
    local ed = worst(gd, sum)
    we = math.max(we, ed)
    if ed > 1e-5 then bad = bad or (ad.path .. " down") end
  end
  T.ok(#per.adapter.adapters == 40 and e < 1e-6 and math.abs(l1 - l2) < 1e-6 * l2 and not bad,
    string.format("the fused adapters' output and loss are the 40 per-module adapters' (worst %.2g); the shared down's "
      .. "gradient is the sum of the parts' and the up's rows are theirs (worst %.2g)%s", e, we,
      bad and (": not " .. bad) or ""))
end

do -- dropout (kohya's network_dropout) on the shared product while training, none when not
  local function out(dropout, training)
    local r = fx.graph(kohya_attach{dropout = dropout})
    flux_lora.load(r.p, r.adapter, KOHYA)
    r.p.training = training
    r.p:forward()
    return r.p:get(r.y)
  end
  local plain = out(0, true)
  local e_eval, e_train = worst(out(0.5, false), plain), worst(out(0.5, true), plain)
  T.ok(e_eval == 0 and e_train > 1e-2,
    string.format("dropout 0.5 changes the output while training (by %.2g) and not otherwise", e_train))
end

do -- diffusers' targets on their own modules: output, loss and gradients are PEFT's (tests/data/flux/ref.safetensors)
  local f <close> = ck.safetensors(fx.REF .. "ref.safetensors")
  -- the target [2, 16, 4, 6] packed as the output is, 2x2 patches channel-major (the mean is the same)
  local t, packed = f:read("target"), {}
  for b = 0, 1 do
    for h2 = 0, 1 do
      for w2 = 0, 2 do
        for c = 0, 15 do
          for ph = 0, 1 do
            for pw = 0, 1 do
              packed[#packed + 1] = t[((b * 16 + c) * 4 + 2 * h2 + ph) * 6 + 2 * w2 + pw + 1]
            end
          end
        end
      end
    end
  end
  local r = fx.graph(function(model) return flux_lora.attach(model, {rank = 4, alpha = 8, targets = "diffusers"}) end,
    {loss = packed})
  for _, ad in ipairs(r.adapter.adapters) do
    r.p:set(ad.down, f:read("lora/" .. ad.path .. ".lora_A.weight"))
    r.p:set(ad.up, f:read("lora/" .. ad.path .. ".lora_B.weight"))
  end
  local loss = r.p:step()
  local e = worst(r.p:get(r.y), f:read("lora_out"))
  local want = f:read("lora_loss")[1]
  local bad, we = nil, 0
  for _, ad in ipairs(r.adapter.adapters) do
    for k, name in pairs{lora_A = ad.down, lora_B = ad.up} do
      local err = worst(r.p:grad(name), f:read("lora_grad/" .. ad.path .. "." .. k .. ".weight"))
      we = math.max(we, err)
      if err > 1e-4 and not bad then bad = name end
    end
  end
  T.ok(#r.adapter.adapters == 30 and e < 1e-5 and math.abs(loss - want) < 1e-5 * want and not bad,
    string.format("PEFT's adapter on diffusers' targets: output (worst %.2g), loss (%.7g, want %.7g) and the 60 "
      .. "factors' gradients (worst %.2g) are autograd's%s", e, loss, want, we, bad and (": not " .. bad) or ""))
end

do -- kohya's split_qkv files (a fused module's down stacked [3r, in], its up block-diagonal) load for generation
  local split = rewrite(KOHYA, tmp .. "split_qkv.safetensors", function(list, meta)
    local k = "lora_unet_double_blocks_1_txt_attn_qkv"
    local by = {}
    for _, e in ipairs(list) do by[e[1]] = e end
    local d, u, a = by[k .. ".lora_down.weight"], by[k .. ".lora_up.weight"], by[k .. ".alpha"]
    local r, out = d[2][1], d[2][2]
    local dd, uu = {}, {}
    for _ = 1, 3 do for i = 1, #d[3] do dd[#dd + 1] = d[3][i] end end
    for row = 1, u[2][1] do
      local part = (row - 1) // (u[2][1] // 3)
      for col = 1, 3 * r do
        uu[#uu + 1] = (col - 1) // r == part and u[3][(row - 1) * r + (col - 1) % r + 1] or 0
      end
    end
    d[2], d[3] = {3 * r, out}, dd
    u[2], u[3] = {u[2][1], 3 * r}, uu
    a[3] = {a[3][1] * 3} -- kohya keeps alpha over the tripled rank: here the same scale
    return list, meta
  end)
  local r = fx.graph(function(model) return flux_lora.attach(model, {from = split, strength = 0.7}) end)
  flux_lora.load(r.p, r.adapter, split)
  r.p:forward()
  local ranks = {}
  for _, ad in ipairs(r.adapter.adapters) do if ad.rank ~= 4 then ranks[#ranks + 1] = ad.kohya .. " " .. ad.rank end end
  local e = worst(r.p:get(r.y), ref:read("diffusers_kohya"))
  T.ok(table.concat(ranks) == "lora_unet_double_blocks_1_txt_attn_qkv 12" and e < 1e-5,
    string.format("a split_qkv module runs at its rank 12 and gives the fused one's output (worst %.2g)", e))
end

do -- an alpha a bf16 file rounds (0.7 holds as 0.69921875) loads back into the adapter that saved it
  local r = fx.graph(kohya_attach{alpha = 0.7})
  fx.set_values(r.p, r.adapter)
  flux_lora.save(r.p, r.adapter, tmp .. "bf16.safetensors", {dtype = "BF16"})
  local back = fx.graph(kohya_attach{alpha = 0.7})
  local f <close> = ck.safetensors(tmp .. "bf16.safetensors")
  T.ok(flux_lora.load(back.p, back.adapter, tmp .. "bf16.safetensors") == "kohya" and
    f:read("lora_unet_single_blocks_0_linear1.alpha")[1] == 0.69921875 and f:metadata().ss_network_alpha == "0.7",
    "a bf16 kohya file of alpha 0.7 (its alpha tensors 0.69921875, ss_network_alpha 0.7) loads back")
end

do -- diffusers' targets: 30 modules in diffusers' layout; no kohya name for a part of a fused module
  local r = fx.graph(function(model) return flux_lora.attach(model, {rank = 4, alpha = 8, targets = "diffusers"}) end)
  local h = r.adapter
  local want = {}
  for _, t in ipairs(flux.LORA_TARGETS) do want[t] = true end
  local n = 0
  for _, t in ipairs(h.peft_targets) do if want[t] then n = n + 1; want[t] = nil end end
  T.ok(#h.adapters == 30 and n == #flux.LORA_TARGETS and #h.peft_targets == n,
    "targets \"diffusers\": the 30 modules train_dreambooth_lora_flux.py adapts, its target_modules")
  local rng = T.rng(9)
  for _, ad in ipairs(h.adapters) do
    r.p:set(ad.down, T.random_values(rng, ad.rank * ad.in_features))
    r.p:set(ad.up, T.random_values(rng, ad.out_features * ad.rank, -0.2, 0.2))
  end
  local ok, err = pcall(function() flux_lora.save(r.p, h, tmp .. "diffusers_kohya.safetensors") end)
  T.ok(not ok and err:find("transformer_blocks.0.attn.to_q", 1, true) and err:find("format peft", 1, true)
    and err:find("test_flux_lora%.lua:%d+:") and not err:find("\n") and not read_bytes(tmp .. "diffusers_kohya.safetensors"),
    "saving them in kohya's layout is refused in one line naming the module, nothing written: " .. tostring(err))
  flux_lora.save(r.p, h, tmp .. "diffusers.safetensors", {format = "peft", dtype = "BF16"})
  local back = fx.graph(function(model) return flux_lora.attach(model, {rank = 4, alpha = 8, targets = "diffusers"}) end)
  flux_lora.load(back.p, back.adapter, tmp .. "diffusers.safetensors")
  r.p:forward()
  back.p:forward()
  local e = worst(back.p:get(back.y), r.p:get(r.y))
  T.ok(e < 2e-2 and e > 0, string.format("saved in bf16 and loaded back, the output is the adapter's to bf16 rounding (%.2g)", e))
end

do -- refusals: one line naming the file and the key, at the calling line
  local k = "lora_unet_double_blocks_0_img_attn_qkv"
  local qv = "transformer.transformer_blocks.0.attn.to_v.lora_A.weight"
  local files = {
    extra = rewrite(KOHYA, tmp .. "extra.safetensors", add(k .. ".dora_scale", {96, 1}, (function() local t = {} for i = 1, 96 do t[i] = 1 end return t end)())),
    te = rewrite(KOHYA, tmp .. "te.safetensors", add("lora_te1_text_model_encoder_layers_0_mlp_fc1.alpha", {}, {1})),
    missing = rewrite(KOHYA, tmp .. "missing.safetensors", drop(k .. ".lora_up.weight")),
    block7 = rewrite(KOHYA, tmp .. "block7.safetensors", add("lora_unet_double_blocks_7_img_mlp_0.alpha", {}, {2})),
    split = rewrite(PEFT, tmp .. "split.safetensors", function(list, meta)
      for _, e in ipairs(list) do if e[1] == qv then e[3][5] = e[3][5] + 0.25 end end
      return list, meta
    end),
    nometa = rewrite(PEFT, tmp .. "nometa.safetensors", function(list) return list, {format = "pt"} end),
    other = rewrite(KOHYA, tmp .. "other.safetensors", function(list)
      local out = {}
      for _, e in ipairs(list) do out[#out + 1] = {e[1]:gsub("^lora_unet_", "lora_transformer_"), e[2], e[3]} end
      return out, {}
    end),
  }
  local function attach_load(file, o)
    local model = flux.FluxTransformer2DModel("flux-tiny")
    model:freeze()
    local h = flux_lora.attach(model, o or {rank = 4, alpha = 2})
    local g = ck.graph()
    local x = flux.inputs(g, "flux-tiny", {height = 2, width = 2, tokens = 1})
    local y = model:forward(g, x.hidden_states, x.encoder_hidden_states, x.pooled_projections, x.timestep, x.rope, x.guidance)
    local p = g:compile{outputs = {y}, optimizer = "none"}
    local format = flux_lora.load(p, h, file)
    return format
  end
  local cases = {
    {function() return attach_load(files.extra) end, files.extra, k .. ".dora_scale", "none of this adapter's"},
    {function() return attach_load(files.extra, {from = files.extra}) end, files.extra, k .. ".dora_scale",
     "is not kohya's NAME.lora_down.weight"},
    {function() return attach_load(files.te) end, files.te, "lora_te1_text_model_encoder_layers_0_mlp_fc1.alpha",
     "a text encoder's adapter"},
    {function() return attach_load(files.missing) end, files.missing, k .. ".lora_up.weight", "missing tensor"},
    {function() return attach_load(files.missing, {from = files.missing}) end, files.missing, k .. ".lora_down.weight",
     "has no lora_up beside it"},
    {function() return attach_load(files.block7, {from = files.block7}) end, files.block7,
     "lora_unet_double_blocks_7_img_mlp_0.alpha", "names no Linear module of this Flux transformer"},
    {function() return attach_load(KOHYA, {rank = 8, alpha = 2}) end, KOHYA, "lora_down.weight",
     "has shape %[4, 32%]; the rank%-8 lora_down of [%w_.]+ is %[8, 32%]"},
    {function() return attach_load(KOHYA, {rank = 4, alpha = 4}) end, KOHYA, ".alpha", "is 2, the adapter has alpha 4"},
    {function() return attach_load(PEFT, {rank = 4, alpha = 4}) end, PEFT, "transformer_blocks.0.norm1.linear",
     "lora_adapter_metadata gives"},
    {function() return attach_load(files.nometa) end, files.nometa, "transformer_blocks.0.norm1.linear",
     "no lora_adapter_metadata, so diffusers runs"},
    {function() return attach_load(files.split) end, files.split, qv, "differs from"},
    {function() return attach_load(KOHYA, {rank = 4, alpha = 2, targets = "diffusers"}) end, KOHYA,
     "transformer_blocks.0.attn.to_q", "has no kohya name"},
    {function() return attach_load(files.other) end, files.other, "lora_transformer_", "neither kohya's"},
    {function() return attach_load(tmp .. "none.safetensors") end, tmp .. "none.safetensors", "", ""},
  }
  for i, c in ipairs(cases) do
    local ok, err = pcall(c[1])
    err = tostring(err)
    T.ok(not ok and err:find(c[2], 1, true) and err:find(c[3], 1, true) and err:find(c[4]) and not err:find("\n")
      and err:find("test_flux_lora%.lua:%d+:"), "refused " .. i .. ": " .. err)
  end
  local model = flux.FluxTransformer2DModel("flux-tiny")
  local bad = {
    {function() local h = flux_lora.attach(model, {rank = 0}); return h end, "rank must be a positive integer"},
    {function() local h = flux_lora.attach(model, {rank = 4, dropout = 1}); return h end, "dropout must be in %[0, 1%)"},
    {function() local h = flux_lora.attach(model, {prefix = "lora1"}); return h end, "prefix must be"},
    {function() local h = flux_lora.attach(model, {targets = {"attn.to_qq"}}); return h end, "name no Linear"},
    {function() local h = flux_lora.attach(model, {from = KOHYA, rank = 4}); return h end, "give no rank, alpha or targets"},
    {function() local h = flux_lora.attach(flux.FluxTransformer2DModel("flux-tiny"), {strength = "x"}); return h end, "strength must be a number"},
    {function() local u = require("ck.unet").UNet2DConditionModel("sdxl-tiny"); local h = flux_lora.attach(u); return h end,
     "must be ck.flux's FluxTransformer2DModel"},
    {function() flux_lora.attach(model); local h = flux_lora.attach(model); return h end, "already has an adapter under prefix \"\""},
    {function()
      local m = flux.FluxTransformer2DModel("flux-tiny")
      lora.attach(m, {targets = {"attn.to_out.0"}})
      local h = flux_lora.attach(m)
      return h
    end, "'transformer_blocks.0.attn.to_out.0' already has a ck.lora adapter"},
    {function()
      local m = flux.FluxTransformer2DModel("flux-tiny")
      flux_lora.attach(m)
      local h = lora.attach(m, {targets = {"attn.to_out.0"}})
      return h
    end, "lora.attach: 'transformer_blocks.0.attn.to_out.0' already has an adapter"},
  }
  for i, c in ipairs(bad) do
    local ok, err = pcall(c[1])
    err = tostring(err)
    T.ok(not ok and err:find(c[2]) and not err:find("\n") and err:find("test_flux_lora%.lua:%d+:"),
      "bad attach " .. i .. " refused in one line: " .. err)
  end
end

for _, name in ipairs(ck.listdir(tmp)) do os.remove(tmp .. name) end
os.remove(tmp)
T.done()
