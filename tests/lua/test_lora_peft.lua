-- PEFT adapter files (lora.save format "peft") against what diffusers and peft
-- write themselves (tests/data/peft, made by tests/ref/make_peft_ref.py with
-- the versions in VERSIONS.txt): the same keys, shapes and dtypes, and the
-- lora_adapter_metadata JSON and adapter_config.json fields diffusers and peft
-- build their LoraConfig from, so that each module loads at alpha/r (here
-- alpha 8 at rank 4, and LoCon convolutions at 1/2 through rank_pattern and
-- alpha_pattern). The reference script loaded files of exactly this layout
-- through diffusers' load_lora_weights and peft's PeftModel.from_pretrained
-- and recorded the outputs; the last block checks that record.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local lora = require "ck.lora"

local function read_json(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return ck.json_decode(s)
end

local REF = {default = read_json("tests/data/peft/default.json"), locon = read_json("tests/data/peft/locon.json")}

local tmp = string.format("out/test_lora_peft.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local dirs = {}
local function dir(name)
  local d = tmp .. "/" .. name
  assert(ck.mkdir(d))
  dirs[#dirs + 1] = d
  return d
end

-- JSON values equal: tables field by field (both ways), ck.json_null only to itself
local function deep_equal(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  if a == ck.json_null or b == ck.json_null then return a == b end
  for k, v in pairs(a) do
    if not deep_equal(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

local function show(v) return type(v) == "table" and ck.json_encode(v) or tostring(v) end

-- the modules of model that peft's target_modules rule selects: a path equal
-- to a name, or ending in "." .. name
local function selected(model, names)
  local s = {}
  for _, e in ipairs(model:named_modules("")) do
    local path = e[1]
    if path ~= "" then
      for _, n in ipairs(names) do
        if path == n or path:sub(-#n - 1) == "." .. n then
          s[path] = true
          break
        end
      end
    end
  end
  return s
end

-- {key = shape} and the set of dtypes of a safetensors file
local function layout(path)
  local f <close> = ck.safetensors(path)
  local keys, dtypes = {}, {}
  for _, k in ipairs(f:keys()) do
    keys[k] = f:shape(k)
    dtypes[f:dtype(k)] = true
  end
  return keys, dtypes, f:metadata()
end

-- the first key where two {key = shape} tables differ, or nil
local function keys_differ(a, b)
  for k, s in pairs(a) do
    if not b[k] then return k .. " (not in the reference)" end
    if not deep_equal(s, b[k]) then return k .. " shape " .. show(s) .. " vs " .. show(b[k]) end
  end
  for k in pairs(b) do
    if not a[k] then return k .. " (missing)" end
  end
  return nil
end

-- the first field (under prefix) where ckrun's config c differs from the
-- reference ref: target_modules by the modules they select on model, the
-- rest as JSON values (fields ckrun leaves out keep the defaults)
local function config_differs(c, ref, prefix, model)
  for k, v in pairs(c) do
    local name = k:sub(#prefix + 1)
    if k:sub(1, #prefix) ~= prefix then return k .. " (no " .. prefix .. " prefix)" end
    if name == "target_modules" then
      if not deep_equal(selected(model, v), selected(model, ref[k])) then return k end
    elseif not deep_equal(v, ref[k]) then
      return k .. ": " .. show(v) .. " vs " .. show(ref[k])
    end
  end
  return nil
end

-- the scale peft gives module path from a config under prefix: the alpha and
-- rank of the pattern entry naming the path, else lora_alpha / r
local function scale_of(c, prefix, path)
  local r = (c[prefix .. "rank_pattern"] or {})[path] or c[prefix .. "r"]
  local a = (c[prefix .. "alpha_pattern"] or {})[path] or c[prefix .. "lora_alpha"]
  return a / r
end

-- sdxl-tiny with the reference's adapter and nonzero seeded adapter weights
local function adapted(ref, seed)
  local model = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  local h = lora.attach(model, {rank = ref.rank, alpha = ref.alpha, conv_rank = ref.conv_rank ~= ck.json_null and
    ref.conv_rank or nil, conv_alpha = ref.conv_alpha ~= ck.json_null and ref.conv_alpha or nil})
  local g = ck.graph()
  local _, y = unet.build(g, model, {batch = 1, height = 16, width = 16, frozen = true})
  local p = g:compile{outputs = {y}, seed = seed}
  local tensors = {}
  for _, ad in ipairs(h.adapters) do
    tensors[#tensors + 1] = g:get(ad.down)
    tensors[#tensors + 1] = g:get(ad.up)
  end
  T.set_random(p, seed, tensors)
  return model, h, p
end

local function same_adapters(p1, h1, p2, h2)
  for i, ad in ipairs(h1.adapters) do
    if p1:checksum(ad.down) ~= p2:checksum(h2.adapters[i].down) or p1:checksum(ad.up) ~= p2:checksum(h2.adapters[i].up) then
      return false, ad.path
    end
  end
  return true
end

for _, case in ipairs{"default", "locon"} do
  local ref = REF[case]
  local model, h, p = adapted(ref, 3)
  local d = dir(case)
  local out = d .. "/lora.safetensors"
  lora.save(p, h, out, {format = "peft", metadata = {ss_steps = "10"}})

  -- the modules adapted are diffusers' modules for these options
  local want = {}
  for _, a in ipairs(ref.adapted) do want[a.path] = a end
  local wrong
  for _, ad in ipairs(h.adapters) do
    local w = want[ad.path]
    if not w or w.rank ~= ad.rank or w.alpha ~= ad.alpha then wrong = wrong or ad.path end
  end
  T.ok(#h.adapters == #ref.adapted and not wrong, string.format("%s: ckrun adapts the %d modules the reference adapts, "
    .. "at the same ranks and alphas%s", case, #ref.adapted, wrong and (" (not " .. wrong .. ")") or ""))

  -- OUT: diffusers' keys, shapes, dtype and metadata
  local keys, dtypes, meta = layout(out)
  local bad = keys_differ(keys, ref.diffusers_file.keys)
  T.ok(not bad, case .. ": the file's keys and shapes are those of diffusers' save_lora_weights" ..
    (bad and (": " .. bad) or ""))
  T.ok(deep_equal(dtypes, set_of(ref.diffusers_file.dtypes)) and dtypes.F32,
    case .. ": every tensor is F32, as in diffusers' file")
  T.ok(meta.format == ref.diffusers_file.format and meta.ss_steps == "10",
    case .. ": metadata format = " .. tostring(meta.format) .. ", and the caller's metadata is kept")
  local m = ck.json_decode(meta.lora_adapter_metadata or "null")
  T.ok(type(m) == "table", case .. ": lora_adapter_metadata is a JSON object")
  local dm, cm = ref.diffusers_file.lora_adapter_metadata, ref.ckrun_file.lora_adapter_metadata
  bad = config_differs(m, dm, "unet.", model)
  T.ok(not bad, case .. ": every field of lora_adapter_metadata equals diffusers' own (target_modules by the "
    .. "modules selected)" .. (bad and (": " .. bad) or ""))
  T.ok(deep_equal(set_of(m["unet.target_modules"]), set_of(cm["unet.target_modules"])) and
    (function() local c = {} for k, v in pairs(m) do c[k] = v end
       c["unet.target_modules"] = cm["unet.target_modules"]; return deep_equal(c, cm) end)(),
    case .. ": lora_adapter_metadata holds exactly the fields of the file the reference loaded at alpha/r")
  T.ok(deep_equal(selected(model, m["unet.target_modules"]), set_of(h.paths)),
    case .. ": its target_modules select exactly the adapted modules")
  local off
  for _, ad in ipairs(h.adapters) do
    local s = scale_of(m, "unet.", ad.path)
    if math.abs(s - ad.alpha / ad.rank) > 1e-12 or math.abs(s - ref.alpha / ref.rank) > 1e-12 and ad.kernel == 1 then
      off = off or (ad.path .. " " .. s)
    end
  end
  T.ok(not off and m["unet.r"] == 4 and m["unet.lora_alpha"] == 8,
    case .. ": r 4, lora_alpha 8, and the patterns give each module alpha/r" .. (off and (" (not " .. off .. ")") or ""))
  if case == "locon" then
    local conv3 = 0
    for _, ad in ipairs(h.adapters) do
      if ad.kernel > 1 then
        conv3 = conv3 + 1
        assert(m["unet.rank_pattern"][ad.path] == 2 and m["unet.alpha_pattern"][ad.path] == 1, ad.path)
      end
    end
    T.ok(conv3 > 0 and conv3 == #(function() local t = {} for k in pairs(m["unet.rank_pattern"]) do t[#t + 1] = k end
      return t end)(), string.format("locon: rank_pattern and alpha_pattern name the %d 3x3 convolutions, at 2 and 1", conv3))
  else
    T.ok(next(m["unet.rank_pattern"]) == nil and next(m["unet.alpha_pattern"]) == nil and
      deep_equal(m["unet.target_modules"], {"to_q", "to_k", "to_v", "to_out.0"}),
      "default: no patterns; target_modules are the targets as given")
  end

  -- the folder: adapter_config.json and adapter_model.safetensors as peft's save_pretrained
  local cfg = read_json(d .. "/adapter_config.json")
  bad = config_differs(cfg, ref.peft_folder.adapter_config, "", model)
  T.ok(not bad, case .. ": every field of adapter_config.json equals peft's save_pretrained's" ..
    (bad and (": " .. bad) or ""))
  T.ok(cfg.peft_type == "LORA" and cfg.r == 4 and cfg.lora_alpha == 8 and cfg.inference_mode == true and
    deep_equal(set_of(cfg.target_modules), set_of(ref.ckrun_adapter_config.target_modules)),
    case .. ": adapter_config.json: peft_type LORA, r 4, lora_alpha 8, inference_mode, the reference's target_modules")
  local pkeys, pdtypes, pmeta = layout(d .. "/adapter_model.safetensors")
  bad = keys_differ(pkeys, ref.peft_folder.adapter_model_keys)
  T.ok(not bad and deep_equal(pdtypes, set_of(ref.peft_folder.dtypes)) and pmeta.format == "pt",
    case .. ": adapter_model.safetensors has save_pretrained's keys (base_model.model.*), shapes and dtype" ..
    (bad and (": " .. bad) or ""))
  local pm = ck.json_decode(pmeta.lora_adapter_metadata)
  T.ok(pm.r == 4 and pm.lora_alpha == 8 and deep_equal(pm.rank_pattern, m["unet.rank_pattern"]),
    case .. ": adapter_model.safetensors carries the config bare, as diffusers' save_lora_adapter writes it")

  -- half precision: the same metadata, tensors in that dtype
  for _, dt in ipairs{"F16", "BF16"} do
    local hd = dir(case .. "_" .. dt)
    lora.save(p, h, hd .. "/lora.safetensors", {format = "peft", dtype = dt, metadata = {ss_steps = "10"}})
    local k2, dt2, m2 = layout(hd .. "/lora.safetensors")
    local pk2, pdt2, pm2 = layout(hd .. "/adapter_model.safetensors")
    local c2 = read_json(hd .. "/adapter_config.json")
    T.ok(not keys_differ(k2, keys) and deep_equal(dt2, {[dt] = true}) and deep_equal(pdt2, {[dt] = true}) and
      not keys_differ(pk2, pkeys) and m2.lora_adapter_metadata == meta.lora_adapter_metadata and
      pm2.lora_adapter_metadata == pmeta.lora_adapter_metadata and deep_equal(c2, cfg) and m2.format == "pt",
      string.format("%s: dtype %s: every tensor %s, the same keys, lora_adapter_metadata and adapter_config.json",
        case, dt, dt))
  end

  -- ckrun loads both files back, and refuses an adapter of another alpha
  local _, h2, p2 = adapted(ref, 9)
  T.ok(not same_adapters(p, h, p2, h2), case .. ": a second program starts with other adapter weights")
  T.ok(lora.load(p2, h2, out) == "peft" and same_adapters(p, h, p2, h2), case .. ": the file loads back into ckrun")
  local _, h3, p3 = adapted(ref, 10)
  T.ok(lora.load(p3, h3, d .. "/adapter_model.safetensors") == "peft_model" and same_adapters(p, h, p3, h3),
    case .. ": adapter_model.safetensors loads back into ckrun")
  local other = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  local h4 = lora.attach(other, {rank = 4, alpha = 4, conv_rank = h.conv_rank, conv_alpha = h.conv_alpha})
  local g4 = ck.graph()
  unet.build(g4, other, {batch = 1, height = 16, width = 16, frozen = true})
  local p4 = g4:compile{seed = 1}
  local ok, err = pcall(function() lora.load(p4, h4, out) end) -- a script line calls it
  T.ok(not ok and err:find(out, 1, true) and err:find("alpha 8, the adapter has rank 4 alpha 4", 1, true) and
    err:find("test_lora_peft%.lua:%d+:"), case .. ": loading into an adapter with alpha 4 is an error naming the file "
    .. "and the line: " .. tostring(err))
end

do -- kohya's format is as it was: one file, alpha tensors, no PEFT metadata or folder files
  local _, h, p = adapted(REF.default, 4)
  local d = dir("kohya")
  lora.save(p, h, d .. "/lora.safetensors")
  local names = ck.listdir(d)
  local keys, _, meta = layout(d .. "/lora.safetensors")
  local n = 0
  for _ in pairs(keys) do n = n + 1 end
  T.ok(#names == 1 and n == 3 * #h.adapters and meta.lora_adapter_metadata == nil and meta.ss_network_alpha == "8",
    "kohya: only the file, three keys per module, ss_network_alpha 8, no lora_adapter_metadata")
end

do -- bad names and options
  local _, h, p = adapted(REF.default, 5)
  local d = dir("bad")
  local ok, err = pcall(function() lora.save(p, h, d .. "/adapter_model.safetensors", {format = "peft"}) end)
  T.ok(not ok and err:find(d .. "/adapter_model.safetensors", 1, true) and err:find("another name", 1, true) and
    err:find("test_lora_peft%.lua:%d+:") and #ck.listdir(d) == 0,
    "peft into a file named adapter_model.safetensors: an error naming it and the line, nothing written: " .. tostring(err))
  lora.save(p, h, d .. "/only.safetensors", {format = "peft", peft_folder = false})
  local names = ck.listdir(d)
  T.ok(#names == 1 and names[1] == "only.safetensors", "peft_folder = false: only the file")
end

do -- the reference's record: diffusers loads the layout at alpha/r, and without the metadata at 1.0
  for _, case in ipairs{"default", "locon"} do
    local o = REF[case].outputs
    local function diff(a, b)
      local worst, scale = 0, 1
      for i = 1, #o[b] do
        worst = math.max(worst, math.abs(o[a][i] - o[b][i]))
        scale = math.max(scale, math.abs(o[b][i]))
      end
      return worst / scale
    end
    local n = 1
    for _, v in ipairs(o.shape) do n = n * v end
    T.ok(#o.adapter_in_memory == n and diff("adapter_in_memory", "base") > 1e-2 and
      diff("diffusers_file_load_lora_weights", "adapter_in_memory") <= 1e-4 and
      diff("ckrun_file_load_lora_weights", "adapter_in_memory") <= 1e-4 and
      diff("ckrun_folder_peft_from_pretrained", "adapter_in_memory") <= 1e-4 and
      diff("ckrun_file_without_metadata", "adapter_in_memory") > 1e-2,
      string.format("%s: recorded UNet outputs: diffusers' file, ckrun's file (load_lora_weights) and folder "
        .. "(PeftModel.from_pretrained) give the adapter's output within 1e-4; without lora_adapter_metadata "
        .. "it is off by %.3g", case, diff("ckrun_file_without_metadata", "adapter_in_memory")))
  end
end

for i = #dirs, 1, -1 do
  for _, name in ipairs(ck.listdir(dirs[i])) do os.remove(dirs[i] .. "/" .. name) end
  os.remove(dirs[i])
end
os.remove(tmp)
T.done()
