-- LoRA adapters on ck.flux's transformer as kohya's sd-scripts (networks/lora_flux.py)
-- and diffusers train them, saved in the two layouts users load: kohya's
-- lora_unet_<Black Forest Labs module> file (ComfyUI, Forge, kohya, diffusers) and
-- diffusers' transformer.<module>.lora_A/lora_B file (diffusers; ai-toolkit writes it).
--
-- The contract a trainer's Flux family (and generation) calls:
--
--   local h = flux_lora.attach(model, {rank = 16, alpha = 16, targets = "kohya",
--                                      dropout = 0, loraplus_lr_ratio = 1})
--   local y = model:forward(g, ...)   -- after attach; the adapter's parameters are trainable
--   local p = g:compile{...}
--   flux_lora.save(p, h, "out/lora.safetensors", {format = "kohya" | "peft", metadata = {ss_... = "..."},
--                                                 dtype = "BF16", title = "..."})
--   flux_lora.load(p, h, "out/lora.safetensors")  -- resume: either layout, refused unless it fits h
--
--   -- generation: the adapter a file holds (either layout, any rank), frozen, at a strength;
--   -- several files on one model each take their own prefix
--   local h = flux_lora.attach(model, {from = "lora.safetensors", strength = 0.8, prefix = "lora1."})
--   ... compile ...
--   flux_lora.load(p, h, "lora.safetensors")
--
-- targets: "kohya" (the default) adapts every Linear of the double and single
-- blocks, modulation included, as kohya does: per double block img_mod.lin,
-- img_attn.qkv, img_attn.proj, img_mlp.0, img_mlp.2 and the same five of txt_;
-- per single block linear1, linear2, modulation.lin. BFL's img_attn.qkv,
-- txt_attn.qkv and linear1 are one Linear each where ck.flux (diffusers) has
-- three or four (to_q, to_k, to_v; proj_mlp besides in linear1): kohya's adapter
-- on such a module is one lora_down and one lora_up whose rows are the parts'.
-- Here it is the same: one down [rank, in] that the parts share (its product
-- computed once per input, dropout once, as kohya's fused module) and one up
-- [sum of the parts' widths, rank] whose rows each part reads, held in the
-- parts' common parent as diffusers names the fused projections:
-- transformer_blocks.N.attn.to_qkv, .to_added_qkv and
-- single_transformer_blocks.N.to_qkv_mlp. So kohya's file is the parameters
-- as they are, and diffusers' layout gives each part the shared down as its
-- lora_A and its rows of the up as its lora_B, the same adapter (diffusers'
-- own conversion of kohya's file does exactly that).
-- "diffusers" adapts diffusers' train_dreambooth_lora_flux.py targets
-- (flux.LORA_TARGETS), one adapter per module as PEFT has it; a list of
-- module names adapts every Linear whose path ends in one of them, each on its
-- own. Such an adapter on one part of a fused module (to_q alone) has no kohya
-- name: those adapters save in format "peft" only.
--
-- Files:
--   "kohya": lora_unet_<BFL module, dots as underscores>.lora_down.weight,
--     .lora_up.weight and .alpha (one value) per module; metadata ss_network_module
--     networks.lora_flux, ss_base_model_version flux1, ss_network_dim,
--     ss_network_alpha, ss_network_args, ss_v2, ModelSpec (architecture
--     flux-1-dev/lora, flux-1-schnell/lora or flux-1/lora), plus opts.metadata.
--     ComfyUI maps each name onto diffusion_model.<BFL module>.weight and adds
--     strength * alpha / rank * up @ down; diffusers' load_lora_weights splits
--     the fused modules as above.
--   "peft": transformer.<module>.lora_A.weight / lora_B.weight, as diffusers'
--     FluxPipeline.save_lora_weights names them, and lora_adapter_metadata (the
--     LoraConfig's fields under "transformer.") from which diffusers runs each
--     module at alpha / r. ComfyUI reads these names too, but alpha only from
--     NAME.alpha tensors, which diffusers refuses beside lora_adapter_metadata
--     ("Both network_alphas and metadata"): there a file of alpha != rank runs
--     at alpha = rank. The lora_B rows of a fused module
--     are copied out of the graph, so this format holds the adapter in host
--     memory (twice, as the writer copies) while it saves; "kohya" streams it.
-- Loading refuses, in one line naming the file and the key: a key that is no
-- adapter's (a text encoder's, an unknown module's, a LoKr's), a missing or
-- misshaped key, an alpha or a rank that differs from the adapter's, and a
-- fused module's parts whose lora_A differ (no shared down holds them).
local ck = require "ck"
local nn = require "ck.nn"
local flux = require "ck.flux"
local flux_keys = require "ck.flux_keys"
local lora = require "ck.lora"

local M = {}

local errors = require "ck.errors"
local fail, public, shape_str, same_shape = errors.fail, errors.public, errors.shape_str, errors.same_shape

M.KOHYA_PREFIX = "lora_unet_"
M.PEFT_PREFIX = "transformer."
-- diffusers' train_dreambooth_lora_flux.py targets
M.DIFFUSERS_TARGETS = flux.LORA_TARGETS

---- the Black Forest Labs modules and the diffusers modules they hold

-- the Linears of a double and a single block in kohya's order (its
-- named_modules over BFL's DoubleStreamBlock and SingleStreamBlock)
local DOUBLE = {"img_mod.lin", "img_attn.qkv", "img_attn.proj", "img_mlp.0", "img_mlp.2",
                "txt_mod.lin", "txt_attn.qkv", "txt_attn.proj", "txt_mlp.0", "txt_mlp.2"}
local SINGLE = {"linear1", "linear2", "modulation.lin"}
-- outside the blocks (kohya's in_dims adapts the first eight): files with them load
local GLOBAL = {"img_in", "time_in.in_layer", "time_in.out_layer", "vector_in.in_layer", "vector_in.out_layer",
                "guidance_in.in_layer", "guidance_in.out_layer", "txt_in", "final_layer.linear"}
-- a fused module's parameters under the parts' common parent (diffusers'
-- fuse_projections names the double blocks' to_qkv and to_added_qkv)
local FUSED = {["img_attn.qkv"] = "to_qkv", ["txt_attn.qkv"] = "to_added_qkv", linear1 = "to_qkv_mlp"}

local function kohya_name(bfl) return M.KOHYA_PREFIX .. bfl:gsub("%.", "_") end

-- the model's BFL Linear modules: a list in kohya's order (double blocks,
-- single blocks, then the rest) of {bfl, kohya, block = "double" | "single" |
-- "global", parts = {{path, first, count}} (the diffusers modules holding its
-- rows, 1-based), in_features, out_features, parent, fused}, and by_kohya and
-- by_path (diffusers module path -> the entry) maps. The parts come from
-- ck.flux_keys' rules, which load the BFL weights themselves.
local function bfl_modules(model)
  local c = model.config
  local d = flux.inner_dim(c)
  local linears = {}
  for _, e in ipairs(model:named_modules("")) do
    if getmetatable(e[2]) == nn.Linear then linears[e[1]] = e[2] end
  end
  local list, by_kohya, by_path = {}, {}, {}
  local function add(bfl, block)
    local sources = flux_keys.bfl_sources(bfl .. ".weight", d)
    assert(sources, "no ck.flux_keys rule for " .. bfl)
    local e = {bfl = bfl, kohya = kohya_name(bfl), block = block, parts = {}, out_features = 0}
    for _, s in ipairs(sources) do
      local path = s[1]:match("^(.*)%.weight$")
      local m = linears[path]
      if not m then return end -- guidance_in on a model without guidance
      local first, count = 1, m.out_features
      if type(s[2]) == "table" and s[2].rows then first, count = s[2].rows[1], s[2].rows[2] end
      e.parts[#e.parts + 1] = {path = path, first = first, count = count}
      e.in_features = m.in_features
      e.out_features = e.out_features + count
    end
    if #e.parts > 1 then
      e.parent = e.parts[1].path:match("^(.*)%.[^.]+$")
      for _, part in ipairs(e.parts) do
        while part.path:sub(1, #e.parent + 1) ~= e.parent .. "." do e.parent = e.parent:match("^(.*)%.[^.]+$") end
      end
      e.fused = FUSED[bfl:match("^%a+_blocks%.%d+%.(.+)$")]
      assert(e.fused, "no fused name for " .. bfl)
    end
    list[#list + 1] = e
    by_kohya[e.kohya] = e
    for _, part in ipairs(e.parts) do by_path[part.path] = e end
  end
  for i = 0, c.num_layers - 1 do
    for _, m in ipairs(DOUBLE) do add("double_blocks." .. i .. "." .. m, "double") end
  end
  for i = 0, c.num_single_layers - 1 do
    for _, m in ipairs(SINGLE) do add("single_blocks." .. i .. "." .. m, "single") end
  end
  for _, m in ipairs(GLOBAL) do add(m, "global") end
  return {list = list, by_kohya = by_kohya, by_path = by_path, linears = linears}
end

---- the graph

-- an adapter's down and up in graph g, made in the current scope (the
-- module's, or a fused module's parent's) the first time g asks
local function weights(ad, g)
  local w = ad.w[g]
  if w then return w end
  local rel = ad.fused and (ad.fused .. "." .. ad.prefix) or ad.prefix
  local o = {trainable = ad.trainable, init = "kaiming"}
  local down = g:param(rel .. "lora_down.weight", {ad.rank, ad.in_features}, o)
  local up = g:param(rel .. "lora_up.weight", {ad.out_features, ad.rank},
                     {trainable = ad.trainable, init = "zeros", lr_scale = ad.trainable and ad.up_lr_scale or nil})
  ad.down, ad.up = down.name, up.name -- the names attach foresaw, unless the model runs inside a scope
  w = {down = down, up = up, d = {}}
  ad.w[g] = w
  return w
end

-- a Linear with adapters: its output plus, for each, scale * up_rows(dropout(down(x)))
local function adapted_forward(self, g, x)
  local y = self.flux_lora_base(self, g, x)
  for _, b in ipairs(self.flux_lora) do
    local ad = b.adapter
    local w = ad.fused and ad.w[g] or weights(ad, g)
    if not w then
      error("flux_lora: " .. b.path .. " runs outside its block (its adapter lives in " .. ad.parent .. ")", 3)
    end
    local d = w.d[x.id]
    if not d then -- the parts of a fused module share one product (and one dropout) per input
      d = ck.linear(x, w.down)
      if ad.dropout > 0 then d = ck.dropout(d, ad.dropout) end
      w.d[x.id] = d
    end
    local up = w.up
    if b.count ~= ad.out_features then up = ck.slice(up, 0, b.first - 1, b.count) end
    local u = ck.linear(d, up)
    if ad.scale ~= 1 then u = u * ad.scale end
    y = y + u
  end
  return y
end

-- a fused module's parent: makes its adapters' weights in its scope, then runs
local function parent_forward(self, g, ...)
  for _, ad in ipairs(self.flux_lora_groups) do weights(ad, g) end
  return self.flux_lora_parent_base(self, g, ...)
end

---- attaching

local function module_at(model, path)
  for _, e in ipairs(model:named_modules("")) do if e[1] == path then return e[2] end end
  return nil
end

-- the components of a dotted path
local function split(path)
  local t = {}
  for c in path:gmatch("[^.]+") do t[#t + 1] = c end
  return t
end

-- true when the components of target are the last components of path
local function tail_matches(path, target)
  local parts, tp = split(path), split(target)
  if #tp > #parts then return false end
  for i = 1, #tp do
    if parts[#parts - #tp + i] ~= tp[i] then return false end
  end
  return true
end

-- PEFT's target_modules for exactly the adapted paths: each path's name
-- inside its block (attn.to_q) where every module that name reaches is
-- adapted, else the path itself (peft targets a module whose path is a name
-- or ends in "." .. name)
local function peft_targets(model, paths)
  local adapted, out, seen = {}, {}, {}
  for _, p in ipairs(paths) do adapted[p] = true end
  local modules = model:named_modules("")
  local exact = {}
  local function is_exact(name)
    if exact[name] == nil then
      exact[name] = true
      for _, e in ipairs(modules) do
        if e[1] ~= "" and tail_matches(e[1], name) and not adapted[e[1]] then exact[name] = false break end
      end
    end
    return exact[name]
  end
  for _, p in ipairs(paths) do
    local name = p:match("^[%a_]+blocks%.%d+%.(.+)$") or p
    if not is_exact(name) then name = p end
    if not seen[name] then
      seen[name] = true
      out[#out + 1] = name
    end
  end
  return out
end

-- the adapters a kohya or PEFT file holds, for attach{from = path}: a list of
-- {entry (bfl_modules') or path, rank, alpha, alpha_key}
local read_file

local function check_options(opts)
  local dropout = opts.dropout or 0
  if type(dropout) ~= "number" or not (dropout >= 0 and dropout < 1) then
    fail("flux_lora.attach: dropout must be in [0, 1), got %s", tostring(dropout))
  end
  local ratio = opts.loraplus_lr_ratio or 1
  if type(ratio) ~= "number" or not (ratio > 0) then
    fail("flux_lora.attach: loraplus_lr_ratio must be a positive number, got %s", tostring(ratio))
  end
  local strength = opts.strength or 1
  if type(strength) ~= "number" or strength ~= strength then
    fail("flux_lora.attach: strength must be a number, got %s", tostring(strength))
  end
  local prefix = opts.prefix or ""
  if type(prefix) ~= "string" or not (prefix == "" or prefix:match("^[%a_][%w_]*%.$")) then
    fail("flux_lora.attach: prefix must be \"\" or a name and a dot (\"lora1.\"), got %s", tostring(prefix))
  end
  return dropout, ratio, strength, prefix
end

M.attach = public(function(model, opts)
  opts = opts or {}
  if getmetatable(model) ~= flux.FluxTransformer2DModel then
    fail("flux_lora.attach: the model must be ck.flux's FluxTransformer2DModel, got %s",
      type(model) == "table" and tostring(getmetatable(model) and getmetatable(model).__name) or type(model))
  end
  local dropout, ratio, strength, prefix = check_options(opts)
  local mods = bfl_modules(model)
  local specs, targets
  local rank, alpha = opts.rank, opts.alpha
  if opts.from ~= nil then
    if opts.rank or opts.alpha or opts.targets then
      fail("flux_lora.attach: from = %s takes the ranks, alphas and modules from the file; give no rank, alpha or "
        .. "targets", tostring(opts.from))
    end
    specs = read_file(opts.from, model, mods)
    targets = "file"
  else
    rank = rank or 4
    alpha = alpha or rank
    if math.type(rank) ~= "integer" or rank < 1 then
      fail("flux_lora.attach: rank must be a positive integer, got %s", tostring(rank))
    end
    if type(alpha) ~= "number" or not (alpha > 0) or alpha == math.huge then
      fail("flux_lora.attach: alpha must be a positive number, got %s", tostring(alpha))
    end
    targets = opts.targets or "kohya"
    specs = {}
    if targets == "kohya" then
      for _, e in ipairs(mods.list) do
        if e.block ~= "global" then specs[#specs + 1] = {entry = e, rank = rank, alpha = alpha} end
      end
    else
      local list = targets == "diffusers" and M.DIFFUSERS_TARGETS or targets
      if type(list) ~= "table" or #list == 0 then
        fail("flux_lora.attach: targets must be \"kohya\", \"diffusers\" or a non-empty list of module names, got %s",
          tostring(targets))
      end
      for _, e in ipairs(model:named_modules("")) do
        if getmetatable(e[2]) == nn.Linear then
          for _, t in ipairs(list) do
            if type(t) ~= "string" then fail("flux_lora.attach: a target is a %s, not a module name", type(t)) end
            if tail_matches(e[1], t) then
              specs[#specs + 1] = {path = e[1], rank = rank, alpha = alpha}
              break
            end
          end
        end
      end
      if #specs == 0 then
        fail("flux_lora.attach: the targets (%s) name no Linear of this Flux transformer", table.concat(list, ", "))
      end
    end
  end
  local trainable = opts.trainable
  if trainable == nil then trainable = opts.from == nil end
  model.flux_lora_prefixes = model.flux_lora_prefixes or {}
  if model.flux_lora_prefixes[prefix] then
    fail("flux_lora.attach: this model already has an adapter under prefix \"%s\"; give each its own", prefix)
  end
  local h = {rank = rank or specs[1].rank, alpha = alpha or specs[1].alpha, dropout = dropout,
             loraplus_lr_ratio = ratio, strength = strength, prefix = prefix, targets = targets,
             config = model.config, trainable = trainable, adapters = {}, paths = {}, kohya = true,
             from = opts.from}
  h.scale = h.alpha / h.rank
  -- check every module before changing any
  local plan = {}
  for _, s in ipairs(specs) do
    local e = s.entry
    local parts, path, kname, bfl, fused, parent
    if e then
      parts, kname, bfl, fused, parent = e.parts, e.kohya, e.bfl, e.fused, e.parent
      path = fused and (parent .. "." .. fused) or parts[1].path
    else
      local m = mods.linears[s.path]
      parts, path = {{path = s.path, first = 1, count = m.out_features}}, s.path
      local whole = mods.by_path[s.path]
      if whole and #whole.parts == 1 then kname, bfl = whole.kohya, whole.bfl end
    end
    for _, part in ipairs(parts) do
      local m = mods.linears[part.path]
      if rawget(m, "lora") or rawget(m, "lora_branches") then
        fail("flux_lora.attach: '%s' already has a ck.lora adapter", part.path)
      end
    end
    local first = mods.linears[parts[1].path]
    local out = 0
    for _, part in ipairs(parts) do out = out + part.count end
    local ad = {path = path, kohya = kname, bfl = bfl, parts = parts, kind = "linear", kernel = 1,
                in_features = first.in_features, out_features = out, rank = s.rank, alpha = s.alpha,
                alpha_key = s.alpha_key, scale = strength * s.alpha / s.rank, dropout = dropout,
                up_lr_scale = ratio, trainable = trainable, prefix = prefix, fused = fused, parent = parent,
                down = path .. "." .. prefix .. "lora_down.weight", up = path .. "." .. prefix .. "lora_up.weight",
                w = setmetatable({}, {__mode = "k"})}
    if not kname then h.kohya = false end
    plan[#plan + 1] = ad
  end
  model.flux_lora_prefixes[prefix] = true
  for _, ad in ipairs(plan) do
    for _, part in ipairs(ad.parts) do
      local m = mods.linears[part.path]
      if not rawget(m, "flux_lora") then
        m.flux_lora = {}
        m.flux_lora_base = getmetatable(m).updateOutput
        m.updateOutput = adapted_forward
      end
      m.flux_lora[#m.flux_lora + 1] = {adapter = ad, path = part.path, first = part.first, count = part.count}
      h.paths[#h.paths + 1] = part.path
    end
    if ad.fused then
      local pm = module_at(model, ad.parent)
      if not rawget(pm, "flux_lora_groups") then
        pm.flux_lora_groups = {}
        pm.flux_lora_parent_base = rawget(pm, "updateOutput") or getmetatable(pm).updateOutput
        pm.updateOutput = parent_forward
      end
      pm.flux_lora_groups[#pm.flux_lora_groups + 1] = ad
    end
    h.adapters[#h.adapters + 1] = ad
  end
  h.peft_targets = peft_targets(model, h.paths)
  function h.param_count()
    local n = 0
    for _, ad in ipairs(h.adapters) do n = n + ad.rank * (ad.in_features + ad.out_features) end
    return n
  end
  return h
end)

---- names

-- M.entries(h, "kohya" | "peft") -> the file's keys: {key, parameter name}
-- (and for "peft" rows = {first, count} when the key holds rows of the
-- parameter) and kohya's {key, value = alpha}
local function entries(h, format)
  local out = {}
  for _, ad in ipairs(h.adapters) do
    if format == "peft" then
      for _, part in ipairs(ad.parts) do
        local name = M.PEFT_PREFIX .. part.path
        out[#out + 1] = {name .. ".lora_A.weight", ad.down}
        out[#out + 1] = {name .. ".lora_B.weight", ad.up,
                         rows = part.count ~= ad.out_features and {part.first, part.count} or nil}
      end
    elseif format == "kohya" then
      if not ad.kohya then
        fail("the adapter on %s has no kohya name (kohya's modules are BFL's, whose qkv and linear1 are one Linear "
          .. "each): save it in format peft, or attach with targets \"kohya\"", ad.parts[1].path)
      end
      out[#out + 1] = {ad.kohya .. ".lora_down.weight", ad.down}
      out[#out + 1] = {ad.kohya .. ".lora_up.weight", ad.up}
      out[#out + 1] = {ad.kohya .. ".alpha", value = ad.alpha}
    else
      fail("unknown Flux LoRA format '%s' (kohya, peft)", tostring(format))
    end
  end
  return out
end
M.entries = public(entries)

-- the fields of peft's LoraConfig for the adapter, one entry per module (ck.lora's)
local function peft_config(h)
  local per = {}
  for _, ad in ipairs(h.adapters) do
    for _, part in ipairs(ad.parts) do per[#per + 1] = {path = part.path, rank = ad.rank, alpha = ad.alpha} end
  end
  return lora.peft_config{rank = h.rank, alpha = h.alpha, adapters = per, peft_targets = h.peft_targets}
end
M.peft_config = peft_config

---- files

-- the ModelSpec architecture of a config: kohya's names for dev and schnell
local function architecture(c)
  local function same(name)
    local n = flux.config(name)
    for k, v in pairs(n) do
      if k:sub(1, 1) ~= "_" then
        local w = c[k]
        if type(v) == "table" then
          if type(w) ~= "table" or #w ~= #v then return false end
          for i = 1, #v do if v[i] ~= w[i] then return false end end
        elseif v ~= w then
          return false
        end
      end
    end
    return true
  end
  if same("flux-dev") then return "flux-1-dev" end
  if same("flux-schnell") then return "flux-1-schnell" end
  return "flux-1"
end
-- M.architecture(config) -> "flux-1-dev" | "flux-1-schnell" | "flux-1": ModelSpec's name (kohya's) of the model
M.architecture = architecture

local function format_number(v)
  return math.type(v) == "float" and v == math.floor(v) and string.format("%d", v) or tostring(v)
end

-- M.save(p, h, path, {format = "kohya" | "peft", metadata = {...}, dtype = "F32" | "F16" | "BF16", title})
-- writes the adapter atomically (see the header); metadata entries are added
-- to the file's (and replace the defaults)
M.save = public(function(p, h, path, o)
  o = o or {}
  local format = o.format or "kohya"
  local list = entries(h, format)
  local meta
  if format == "kohya" then
    meta = {
      ss_network_module = "networks.lora_flux",
      ss_network_dim = tostring(h.rank),
      ss_network_alpha = format_number(h.alpha),
      ss_base_model_version = "flux1",
      ss_network_args = h.targets == "kohya" and "{}" or ck.json_encode{targets = h.targets},
      ss_v2 = "False",
      ["modelspec.sai_model_spec"] = "1.0.1",
      ["modelspec.architecture"] = architecture(h.config) .. "/lora",
      ["modelspec.implementation"] = "https://github.com/black-forest-labs/flux",
      ["modelspec.title"] = o.title or "ckrun LoRA",
    }
    if h.dropout > 0 then meta.ss_network_dropout = tostring(h.dropout) end
    if h.loraplus_lr_ratio ~= 1 then meta.ss_loraplus_lr_ratio = tostring(h.loraplus_lr_ratio) end
  else
    meta = {format = "pt", lora_adapter_metadata = lora.adapter_metadata(peft_config(h), M.PEFT_PREFIX)}
  end
  for k, v in pairs(o.metadata or {}) do meta[k] = v end
  if format == "kohya" then
    p:save(path, list, {metadata = meta, dtype = o.dtype})
    return
  end
  -- lora_B of a fused module is rows of its up: the tensors go through host arrays
  local arrays, tensors = {}, {}
  for _, e in ipairs(list) do
    local a = arrays[e[2]]
    if not a then
      a = p:array(e[2])
      arrays[e[2]] = a
    end
    if e.rows then a = a:slice(1, e.rows[1], e.rows[2]) end
    tensors[#tensors + 1] = {e[1], a.shape, a}
  end
  ck.write_safetensors(path, tensors, meta, o.dtype)
end)

-- a file's text encoder adapters: named so, refused
local function text_encoder_key(k)
  return k:match("^lora_te%d*_") or k:match("^text_encoder") or k:match("^lora_te_")
end

local function open_keys(f, path)
  local keys = f:keys()
  if #keys == 0 then fail("%s: no tensors: not a LoRA file", path) end
  local format
  for _, k in ipairs(keys) do
    if text_encoder_key(k) then
      fail("%s: tensor '%s' is a text encoder's adapter; ckrun's Flux LoRA adapts the transformer only", path, k)
    end
    if k:sub(1, #M.KOHYA_PREFIX) == M.KOHYA_PREFIX then format = format or "kohya"
    elseif k:sub(1, #M.PEFT_PREFIX) == M.PEFT_PREFIX then format = format or "peft" end
  end
  if not format then
    fail("%s: tensor '%s' is neither kohya's (lora_unet_...) nor diffusers' (transformer.<module>.lora_A.weight) "
      .. "Flux LoRA naming", path, keys[1])
  end
  return keys, format
end

-- lora_adapter_metadata as a table, or nil when the file has none
local function peft_metadata(f, path)
  local raw = f:metadata().lora_adapter_metadata
  if not raw then return nil end
  local ok, c = pcall(ck.json_decode, raw)
  if not ok or type(c) ~= "table" then fail("%s: lora_adapter_metadata is not a JSON object", path) end
  return c
end

-- the rank and alpha lora_adapter_metadata c gives a module (alpha = rank
-- where there is none, as diffusers takes it)
local function peft_rank_alpha(c, path, rank)
  if not c then return rank, rank end
  local r, a = lora.config_rank_alpha(c, M.PEFT_PREFIX, path)
  return r, a
end

read_file = function(path, model, mods)
  if type(path) ~= "string" then fail("flux_lora.attach: from must be a file name, got %s", type(path)) end
  local f <close> = ck.safetensors(path)
  local keys, format = open_keys(f, path)
  local groups, order = {}, {}
  local pat = format == "kohya" and {"^(.-)%.(lora_down)%.weight$", "^(.-)%.(lora_up)%.weight$", "^(.-)%.(alpha)$"}
    or {"^" .. M.PEFT_PREFIX:gsub("%.", "%%.") .. "(.-)%.(lora_A)%.weight$",
        "^" .. M.PEFT_PREFIX:gsub("%.", "%%.") .. "(.-)%.(lora_B)%.weight$"}
  for _, k in ipairs(keys) do
    local name, part
    for _, pt in ipairs(pat) do
      name, part = k:match(pt)
      if name then break end
    end
    if not name then
      fail("%s: tensor '%s' is not %s", path, k, format == "kohya"
        and "kohya's NAME.lora_down.weight, NAME.lora_up.weight or NAME.alpha"
        or "diffusers' transformer.<module>.lora_A.weight or lora_B.weight")
    end
    if format == "kohya" and not mods.by_kohya[name] then
      fail("%s: tensor '%s' names no Linear module of this Flux transformer%s", path, k,
        name:match("^lora_unet_final_layer_adaLN") and " ckrun adapts (BFL's final adaLN holds its halves swapped)" or "")
    elseif format == "peft" and not mods.linears[name] then
      fail("%s: tensor '%s' names no Linear module of this Flux transformer", path, k)
    end
    if not groups[name] then groups[name] = {}; order[#order + 1] = name end
    groups[name][part] = k
  end
  local c = format == "peft" and peft_metadata(f, path) or nil
  local specs = {}
  -- in the model's order
  local rank_of = {}
  for _, name in ipairs(order) do
    local gp = groups[name]
    local dk, uk = gp.lora_down or gp.lora_A, gp.lora_up or gp.lora_B
    if not dk or not uk then
      local have = dk or uk
      fail("%s: tensor '%s' has no %s beside it", path, have, dk and (format == "kohya" and "lora_up" or "lora_B")
        or (format == "kohya" and "lora_down" or "lora_A"))
    end
    local ds = f:shape(dk)
    if #ds ~= 2 or ds[1] < 1 then fail("%s: tensor '%s' has shape %s, not [rank, in]", path, dk, shape_str(ds)) end
    local r = ds[1]
    local spec = {rank = r}
    if format == "kohya" then
      spec.entry = mods.by_kohya[name]
      spec.alpha, spec.alpha_key = r, false
      if gp.alpha then
        local a = f:read(gp.alpha)
        if #a ~= 1 then fail("%s: tensor '%s' holds %d values, an alpha is one", path, gp.alpha, #a) end
        spec.alpha, spec.alpha_key = a[1], true
      end
    else
      spec.path = name
      local fr, fa = peft_rank_alpha(c, name, r)
      if fr ~= r then
        fail("%s: lora_adapter_metadata gives '%s' rank %s, its tensor '%s' has rank %d", path, name, tostring(fr), dk, r)
      end
      if type(fa) ~= "number" or not (fa > 0) then
        fail("%s: lora_adapter_metadata gives '%s' alpha %s", path, name, tostring(fa))
      end
      spec.alpha = fa
    end
    rank_of[name] = spec
  end
  -- the file's modules in the model's order
  if format == "kohya" then
    for _, e in ipairs(mods.list) do if rank_of[e.kohya] then specs[#specs + 1] = rank_of[e.kohya] end end
  else
    for _, e in ipairs(model:named_modules("")) do if rank_of[e[1]] then specs[#specs + 1] = rank_of[e[1]] end end
  end
  return specs
end

-- M.load(p, h, path) -> "kohya" | "peft": the adapter's weights from a file in
-- either layout, every key of it one of the adapter's and every one of the
-- adapter's there; refused in one line naming the file and key otherwise
M.load = public(function(p, h, path)
  if type(h) ~= "table" or type(h.adapters) ~= "table" then fail("flux_lora.load: not a flux_lora.attach handle") end
  local f <close> = ck.safetensors(path)
  local keys, format = open_keys(f, path)
  local want, map = {}, {}
  local function expect(key, shape, what)
    want[key] = {shape = shape, what = what}
  end
  local c
  if format == "kohya" then
    for _, ad in ipairs(h.adapters) do
      if not ad.kohya then
        fail("%s: a kohya file; the adapter on %s has no kohya name (attached with targets %s): load a peft file",
          path, ad.parts[1].path, type(h.targets) == "string" and ("\"" .. h.targets .. "\"") or "of your own")
      end
      local dk, uk, ak = ad.kohya .. ".lora_down.weight", ad.kohya .. ".lora_up.weight", ad.kohya .. ".alpha"
      expect(dk, {ad.rank, ad.in_features}, "the rank-" .. ad.rank .. " lora_down of " .. ad.path)
      expect(uk, {ad.out_features, ad.rank}, "the rank-" .. ad.rank .. " lora_up of " .. ad.path)
      map[ad.down], map[ad.up] = dk, uk
      if ad.alpha_key ~= false then want[ak] = {alpha = ad.alpha} end
    end
  else
    c = peft_metadata(f, path)
    for _, ad in ipairs(h.adapters) do
      local pieces = {}
      for i, part in ipairs(ad.parts) do
        local name = M.PEFT_PREFIX .. part.path
        local ak, bk = name .. ".lora_A.weight", name .. ".lora_B.weight"
        expect(ak, {ad.rank, ad.in_features}, "the rank-" .. ad.rank .. " lora_A of " .. part.path)
        expect(bk, {part.count, ad.rank}, "the rank-" .. ad.rank .. " lora_B of " .. part.path)
        if i == 1 then map[ad.down] = ak end
        pieces[i] = {key = bk}
        local r, a = peft_rank_alpha(c, part.path, ad.rank)
        if r ~= ad.rank or a ~= ad.alpha then
          if c then
            fail("%s: lora_adapter_metadata gives '%s' rank %s alpha %s, the adapter has rank %d alpha %s", path,
              part.path, tostring(r), tostring(a), ad.rank, format_number(ad.alpha))
          end
          fail("%s: no lora_adapter_metadata, so diffusers runs '%s' at alpha = rank (%d); the adapter has alpha %s",
            path, part.path, ad.rank, format_number(ad.alpha))
        end
      end
      map[ad.up] = #pieces == 1 and pieces[1].key or pieces
    end
  end
  for _, k in ipairs(keys) do
    local w = want[k]
    if not w then
      fail("%s: tensor '%s' is none of this adapter's (%d modules, targets %s)", path, k, #h.adapters,
        type(h.targets) == "string" and h.targets or "given")
    end
    if w.alpha then
      local a = f:read(k)
      -- the alpha as the file's dtype holds it (kohya's is saved in the weights' dtype)
      local tol = ({BF16 = 2 ^ -8, F16 = 2 ^ -11})[f:dtype(k)] or 1e-6
      if #a ~= 1 or math.abs(a[1] - w.alpha) > tol * math.max(1, math.abs(w.alpha)) then
        fail("%s: tensor '%s' is %s, the adapter has alpha %s", path, k, #a == 1 and format_number(a[1]) or
          (#a .. " values"), format_number(w.alpha))
      end
    else
      local s = f:shape(k)
      if not same_shape(s, w.shape) then
        fail("%s: tensor '%s' has shape %s; %s is %s", path, k, shape_str(s), w.what, shape_str(w.shape))
      end
    end
    w.seen = true
  end
  local missing
  for k, w in pairs(want) do
    if not w.seen and (not missing or k < missing) then missing = k end
  end
  if missing then fail("%s: missing tensor '%s'", path, missing) end
  if format == "peft" then -- the parts of a fused module share one down: their lora_A must be one
    for _, ad in ipairs(h.adapters) do
      if #ad.parts > 1 then
        local first = M.PEFT_PREFIX .. ad.parts[1].path .. ".lora_A.weight"
        local a = f:read(first)
        for i = 2, #ad.parts do
          local k = M.PEFT_PREFIX .. ad.parts[i].path .. ".lora_A.weight"
          local b = f:read(k)
          for j = 1, #a do
            if a[j] ~= b[j] then
              fail("%s: tensor '%s' differs from '%s': the adapter shares one lora_down between the parts of %s "
                .. "(kohya's %s); attach with the file's own modules (from = file) to load it", path, k, first,
                ad.bfl, ad.kohya)
            end
          end
        end
      end
    end
  end
  p:load(f, map)
  return format
end)

return M
