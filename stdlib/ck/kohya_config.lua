-- kohya's sd-scripts config files for ckrun's trainer: --config-file (a
-- run's options, in sections) and --dataset-config (datasets and subsets of
-- images), read as kohya reads them (library/train_util.py's
-- read_config_from_file, library/config_util.py), checked, and given in the
-- trainer's terms. The files are TOML, read by ck.read_toml (toml++); a
-- dataset config may be JSON too, as kohya allows.
--
--   local kc = require "ck.kohya_config"
--   local given, from = kc.options("run.toml", spec)   -- spec: the script's options.parse list
--   local d = kc.dataset("dataset.toml", {args = {batch = 2}, supports = {...}})
--
-- kc.options(path_or_table, spec [, {file = NAME, kohya = MAP}]) -> given, from
--   The --config-file's keys as the trainer's option names: kohya flattens its
--   sections ([model_arguments], [training_arguments], ...) into one set of
--   keys, and so does this (a key outside a section counts as one too; a path
--   without .toml gets it, as kohya does). A key names a declared option of
--   spec by its own name (max-grad-norm), kohya's underscore spelling of it
--   (max_grad_norm), or kohya's name for it in MAP (default: ck.options'
--   KOHYA table where it has one: learning_rate -> lr, network_dim -> rank,
--   use_8bit_adam = true -> optimizer adamw8bit, optimizer_type lowercased).
--   given: {option = value}, values as a command line gives them (an array
--   of numbers or strings as "a,b"), so options.parse takes them as given;
--   each checked with the option's own type, range and checks first. from:
--   {option = "run.toml:12"}. The trainer lets the command line win over
--   them, as kohya's argparse does.
--   Refused, in one line "FILE:LINE: what" (FILE alone for a decoded table):
--   a key no declared option answers to (naming the nearest), a key kohya
--   means otherwise than ckrun (MAP's says), one option given twice (by two
--   keys, or in two sections), a value of the wrong type or out of range, a
--   table inside a section.
--
-- kc.dataset(path_or_table [, {file = NAME, args = ARGS, supports = KEYS}]) -> d
--   The --dataset-config: [general], [[datasets]] and their
--   [[datasets.subsets]] (kohya's DreamBooth style: a folder of images with
--   caption files, image_dir, class_tokens, is_reg). Each subset's settings
--   come from the first of: the subset, its dataset, [general], ARGS (the
--   options the command line gave, by ckrun's names: batch, resolution,
--   caption-extension, keep-tokens, ...; kohya's argparse level), kohya's
--   defaults (kc.DEFAULTS). Every key is checked for its level, type and range
--   as kohya's schema has them; resolution is W or [W, H].
--   d.datasets[i] = {at = "FILE:LINE", resolution = {W, H}, batch_size, enable_bucket, min_bucket_reso,
--                    max_bucket_reso, bucket_reso_steps, bucket_no_upscale, network_multiplier, validation_seed,
--                    validation_split, resize_interpolation, subsets = {the dataset's entries of d.subsets}}
--   d.subsets[j]  = {at, dataset = i, image_dir, num_repeats, caption_extension, class_tokens, is_reg,
--                    shuffle_caption, keep_tokens, keep_tokens_separator, caption_separator, secondary_separator,
--                    enable_wildcard, caption_prefix, caption_suffix, flip_aug, color_aug, random_crop,
--                    face_crop_aug_range, caption_dropout_rate, caption_dropout_every_n_epochs,
--                    caption_tag_dropout_rate, token_warmup_min, token_warmup_step, cache_info, alpha_mask,
--                    custom_attributes, resize_interpolation, the dataset's settings (resolution,
--                    batch_size, ...), and from = {key = "FILE:LINE" or "--option"} for each value not a default}
--   d.ignored = {"FILE:LINE: why", ...}: subsets kohya would skip (a second subset of one image_dir in
--   a dataset: kohya keeps the first), for the trainer to warn of.
--   supports (a list of kohya's keys): a key set in the file to other than kohya's default and not
--   in the list is refused naming it, so a setting the trainer cannot honour never passes in silence.
--   Refused as for options, and: a key at a level kohya does not take it (batch_size in a subset), a
--   subset without image_dir, fine-tuning (metadata_file) and ControlNet (conditioning_data_dir)
--   subsets, which ckrun does not read, a dataset without a resolution, buckets that cannot hold it.
--   image_dir is as written (kohya reads it from the working directory).
local ck = require "ck"
local options = require "ck.options"

local M = {}

local MAX_JSON = 1 << 20

---- reading

-- A file (TOML, or JSON when its name says so) or an already decoded table,
-- as value, doc: doc.where(t, k) -> "FILE:LINE" of key or index k of table t
-- (FILE alone where no line is known), doc.keys(t) -> t's string keys in the
-- file's order (else sorted), doc.is_map(t) -> whether t is a TOML table (not
-- an array), doc.name.
local function load(src, name, what)
  local value, pos
  if type(src) == "table" then
    value = src
    name = name or "the " .. what
  elseif type(src) == "string" then
    name = name or src
    if src:lower():match("%.json$") then
      local f, err = io.open(src, "rb")
      if not f then error(string.format("%s: cannot open: %s", name, tostring(err)), 0) end
      local size = f:seek("end")
      if not size or size > MAX_JSON then
        f:close()
        error(string.format("%s: %s bytes: more than the %d KiB a config file may hold", name, tostring(size),
          MAX_JSON >> 10), 0)
      end
      f:seek("set")
      local text = f:read("a")
      f:close()
      local ok, v = pcall(ck.json_decode, text)
      if not ok then error(string.format("%s: %s", name, (tostring(v):gsub("^.-json_decode: ", ""))), 0) end
      value = v
    else
      local ok, v, w = pcall(ck.read_toml, src, {where = true})
      -- the reader's message names the file ("'F': line L, ..."): as "F: line L, ...", without the
      -- line of the stdlib that called it
      if not ok then error((tostring(v):gsub("^.-read_toml: ", ""):gsub("^'(.-)': ", "%1: ")), 0) end
      value, pos = v, w
    end
  else
    error(string.format("kohya_config: give a file name or a decoded table as the %s, got %s", what, type(src)), 3)
  end
  if type(value) ~= "table" then error(string.format("%s: holds no table", name), 0) end
  local doc = {name = name}
  function doc.where(t, k)
    local p = pos and pos[t]
    local line = p and k ~= nil and p.line[k]
    return line and string.format("%s:%d", name, line) or name
  end
  function doc.keys(t)
    local p = pos and pos[t]
    if p and p.order then return p.order end
    local out = {}
    for k in pairs(t) do
      if type(k) == "string" then out[#out + 1] = k end
    end
    table.sort(out)
    return out
  end
  function doc.is_map(t)
    if type(t) ~= "table" then return false end
    local p = pos and pos[t]
    if p then return p.order ~= nil end
    return #t == 0 and (next(t) == nil or type(next(t)) == "string")
  end
  return value, doc
end

local function fail(at, fmt, ...) error(at .. ": " .. string.format(fmt, ...), 0) end

local function shown(v)
  if type(v) == "string" then return "'" .. v .. "'" end
  if type(v) == "table" then
    local parts = {}
    for i = 1, #v do
      if type(v[i]) == "table" or i > 8 then return #v > 0 and "an array" or "a table" end
      parts[i] = shown(v[i])
    end
    return #v > 0 and "[" .. table.concat(parts, ", ") .. "]" or "a table"
  end
  return tostring(v)
end

-- the nearest of names to k within a few edits, or nil
local function nearest(k, names)
  local best, bd = nil, math.huge
  for _, n in ipairs(names) do
    local d = options.distance(k, n)
    if d < bd or (d == bd and best and n < best) then best, bd = n, d end
  end
  if best and bd <= math.max(2, #k // 3) then return best end
end

---- --config-file

-- an array of scalars as "a,b" (how a command line spells a list); nil and
-- why for anything else a section holds that is not a scalar
local function as_given(v)
  if type(v) ~= "table" then return v end
  local parts = {}
  for i = 1, #v do
    local x = v[i]
    if type(x) ~= "string" and type(x) ~= "number" and type(x) ~= "boolean" then return nil, "an array of tables" end
    parts[i] = tostring(x)
  end
  for k in pairs(v) do
    if math.type(k) ~= "integer" then return nil, "a table" end
  end
  return table.concat(parts, ",")
end

-- what options.parse would make of raw for entry e: nil and why when it refuses it
local function check_option(e, raw)
  if e.accept then
    local r, why = e.accept(raw)
    if r == nil then return nil, why end
    raw = r
  end
  for _, w in ipairs(e.also or {}) do
    if raw == w then return raw end
  end
  local ty = options.types[e[2]]
  if not ty then return raw end -- a type this module does not know: options.parse judges it
  local v, why = ty(e, raw)
  if v ~= nil and e.check and not e.check(v) then v, why = nil, "is not allowed" end
  if v == nil and e.says then why = e.says end
  return v, why
end

function M.options(src, spec, opts)
  opts = opts or {}
  if type(spec) ~= "table" then error("kohya_config.options: give the script's list of options", 2) end
  if type(src) == "string" and not src:lower():match("%.toml$") then src = src .. ".toml" end -- kohya's rule
  local value, doc = load(src, opts.file, "config file")
  local map = opts.kohya or options.KOHYA or {}
  local by, names = {}, {}
  for _, e in ipairs(spec) do
    if type(e) == "table" and type(e[1]) == "string" and not e.pos then
      by[e[1]] = e
      names[#names + 1] = e[1]
    end
  end
  local kohya_dashed = {}
  for k, m in pairs(map) do kohya_dashed[k:gsub("_", "-")] = {name = k, entry = m} end
  -- kohya's names of declared options, for hints
  local hint_names = {}
  for _, n in ipairs(names) do hint_names[#hint_names + 1] = n end
  for k, m in pairs(map) do
    if by[m.to] then hint_names[#hint_names + 1] = k end
  end
  table.sort(hint_names)

  -- the keys, flattened as kohya does: a section's keys, or a key outside sections
  local flat = {}
  local function take(t, k, section)
    local at = doc.where(t, k)
    local prev = flat[k]
    if prev then
      fail(at, "%s is given again (first at %s%s): give it once", k, prev.at,
        prev.section and " in [" .. prev.section .. "]" or "")
    end
    flat[k] = {value = t[k], at = at, section = section}
    flat[#flat + 1] = k
  end
  for _, k in ipairs(doc.keys(value)) do
    local v = value[k]
    if doc.is_map(v) then -- a section
      for _, kk in ipairs(doc.keys(v)) do
        if doc.is_map(v[kk]) then
          fail(doc.where(v, kk), "[%s.%s] is a table inside a section; kohya's config files hold sections of options",
            k, kk)
        end
        take(v, kk, k)
      end
    else
      take(value, k, nil)
    end
  end

  local given, from, by_option = {}, {}, {}
  local function declared(n) return by[n] ~= nil end
  for _, k in ipairs(flat) do
    local item = flat[k]
    local d = k:gsub("_", "-")
    local ko = map[k] and {name = k, entry = map[k]} or kohya_dashed[d]
    local option, how
    if declared(k) then
      option = k
    elseif ko and declared(ko.entry.to) and not ko.entry.says then
      option, how = ko.entry.to, ko.entry
    elseif declared(d) then
      option = d
    elseif ko and declared(ko.entry.to) then
      fail(item.at, "%s is kohya's option: %s", k, ko.entry.says)
    else
      local near = nearest(d, names)
      local kn = nearest(k, hint_names)
      local hint = ""
      if kn and (not near or options.distance(k, kn) < options.distance(d, near)) then
        hint = map[kn] and string.format(" (did you mean %s, ckrun's --%s?)", kn, map[kn].to) or
          string.format(" (did you mean %s?)", kn)
      elseif near then
        hint = string.format(" (did you mean %s?)", near)
      end
      fail(item.at, "unknown key %s%s", k, hint)
    end
    local raw, why = as_given(item.value)
    if raw == nil then fail(item.at, "%s is %s; kohya's config files hold values and arrays of them", k, why) end
    if how and how.value ~= nil then -- kohya's flag for a value of a ckrun option
      local on = options.types.flag(nil, raw)
      if on == nil then fail(item.at, "%s is a flag (kohya's; ckrun's --%s %s), got %s", k, option, how.value, shown(raw)) end
      raw = on and how.value or nil
    elseif how and how.lower and type(raw) == "string" then
      raw = raw:lower()
    end
    if raw ~= nil then
      local e = by[option]
      local ok, why2 = check_option(e, raw)
      if ok == nil then
        fail(item.at, "%s%s %s, got %s", k, k ~= option and " (--" .. option .. ")" or "", tostring(why2):gsub(", got .*$", ""),
          shown(item.value))
      end
      if by_option[option] then
        fail(item.at, "%s and %s (%s) both give --%s: give one", k, by_option[option].key, by_option[option].at, option)
      end
      by_option[option] = {key = k, at = item.at}
      given[option], from[option] = raw, item.at
    end
  end
  return given, from
end

---- --dataset-config

-- kohya's dataset keys: their type, range, level and default (the
-- DreamBooth dataclasses of library/config_util.py, with argparse's defaults
-- where those differ: keep_tokens_separator "")
local GENERAL, DATASET, SUBSET = 1, 2, 4
local ANY = GENERAL | DATASET | SUBSET
local UP = GENERAL | DATASET -- a dataset's own settings

local function int(lo) return {kind = "integer", min = lo} end
local function num(lo, hi) return {kind = "number", min = lo, max = hi} end
local BOOL, STR = {kind = "boolean"}, {kind = "string"}

local INTERPOLATIONS = {"lanczos", "nearest", "bilinear", "linear", "bicubic", "cubic", "area", "box"}

M.KEYS = {
  -- the subset's settings (any level)
  image_dir = {t = {kind = "string", nonempty = true}, at = SUBSET},
  num_repeats = {t = int(1), at = ANY, default = 1},
  caption_extension = {t = STR, at = ANY, default = ".caption"},
  class_tokens = {t = STR, at = ANY},
  is_reg = {t = BOOL, at = SUBSET, default = false},
  shuffle_caption = {t = BOOL, at = ANY, default = false},
  keep_tokens = {t = int(0), at = ANY, default = 0},
  keep_tokens_separator = {t = STR, at = ANY, default = ""},
  caption_separator = {t = STR, at = ANY, default = ","},
  secondary_separator = {t = STR, at = ANY},
  enable_wildcard = {t = BOOL, at = ANY, default = false},
  caption_prefix = {t = STR, at = ANY},
  caption_suffix = {t = STR, at = ANY},
  flip_aug = {t = BOOL, at = ANY, default = false},
  color_aug = {t = BOOL, at = ANY, default = false},
  random_crop = {t = BOOL, at = ANY, default = false},
  face_crop_aug_range = {t = {kind = "range"}, at = ANY},
  caption_dropout_rate = {t = num(0, 1), at = ANY, default = 0},
  caption_dropout_every_n_epochs = {t = int(0), at = ANY, default = 0},
  caption_tag_dropout_rate = {t = num(0, 1), at = ANY, default = 0},
  token_warmup_min = {t = int(0), at = ANY, default = 1},
  token_warmup_step = {t = num(0), at = ANY, default = 0},
  cache_info = {t = BOOL, at = ANY, default = false},
  alpha_mask = {t = BOOL, at = SUBSET, default = false},
  custom_attributes = {t = {kind = "table"}, at = ANY},
  resize_interpolation = {t = {kind = "choice", choices = INTERPOLATIONS}, at = ANY},
  -- the dataset's settings ([general] or [[datasets]])
  resolution = {t = {kind = "resolution"}, at = UP, dataset = true},
  batch_size = {t = int(1), at = UP, default = 1, dataset = true},
  enable_bucket = {t = BOOL, at = UP, default = false, dataset = true},
  min_bucket_reso = {t = int(1), at = UP, default = 256, dataset = true},
  max_bucket_reso = {t = int(1), at = UP, default = 1024, dataset = true},
  bucket_reso_steps = {t = int(1), at = UP, default = 64, dataset = true},
  bucket_no_upscale = {t = BOOL, at = UP, default = false, dataset = true},
  network_multiplier = {t = num(), at = UP, default = 1.0, dataset = true},
  validation_seed = {t = int(), at = UP, dataset = true},
  validation_split = {t = num(0, 1), at = UP, default = 0, dataset = true},
}
-- resize_interpolation is both a subset's and a dataset's setting in kohya
M.KEYS.resize_interpolation.dataset = "both"

M.DEFAULTS = {}
for k, s in pairs(M.KEYS) do M.DEFAULTS[k] = s.default end

-- kohya's keys of other kinds of subsets, which ckrun does not read
local OTHER_STYLES = {
  metadata_file = "fine-tuning subsets (metadata_file) are not read by ckrun: give image_dir with caption files beside " ..
    "the images (kohya's DreamBooth style)",
  conditioning_data_dir = "ControlNet subsets (conditioning_data_dir) are not read by ckrun",
}

-- the ckrun option that gives a key at kohya's argparse level
local ARG_OF = {batch_size = "batch", num_repeats = "dataset-repeats"}
local function arg_name(k) return ARG_OF[k] or (k:gsub("_", "-")) end

local KEY_NAMES = {}
for k in pairs(M.KEYS) do KEY_NAMES[#KEY_NAMES + 1] = k end
for k in pairs(OTHER_STYLES) do KEY_NAMES[#KEY_NAMES + 1] = k end
KEY_NAMES[#KEY_NAMES + 1] = "subsets"
table.sort(KEY_NAMES)

local LEVEL_WORDS = {[GENERAL] = "[general]", [DATASET] = "[[datasets]]", [SUBSET] = "[[datasets.subsets]]"}

local function places(mask)
  local out = {}
  for _, l in ipairs({GENERAL, DATASET, SUBSET}) do
    if mask & l ~= 0 then out[#out + 1] = LEVEL_WORDS[l] end
  end
  return table.concat(out, " or ")
end

-- v checked against type t: the value (resolution as {W, H}, a range as
-- {a, b}), or nil and what is wrong
local function check_type(t, v)
  local k = t.kind
  if k == "boolean" then
    if type(v) == "boolean" then return v end
    return nil, "must be true or false"
  elseif k == "string" then
    if type(v) ~= "string" then return nil, "must be a string" end
    if t.nonempty and v == "" then return nil, "must not be empty" end
    return v
  elseif k == "integer" then
    if math.type(v) ~= "integer" then return nil, "must be a whole number" .. (t.min and " >= " .. t.min or "") end
    if t.min and v < t.min then return nil, "must be >= " .. t.min end
    return v
  elseif k == "number" then
    if type(v) ~= "number" or v ~= v then return nil, "must be a number" end
    if (t.min and v < t.min) or (t.max and v > t.max) then
      return nil, t.max and string.format("must be in [%s, %s]", t.min, t.max) or "must be >= " .. t.min
    end
    return v
  elseif k == "choice" then
    for _, c in ipairs(t.choices) do
      if v == c then return v end
    end
    return nil, "must be one of " .. table.concat(t.choices, ", ")
  elseif k == "table" then
    if type(v) == "table" then return v end
    return nil, "must be a table"
  elseif k == "range" then
    if type(v) == "table" and #v == 2 and type(v[1]) == "number" and type(v[2]) == "number" and v[1] > 0 and
        v[1] <= v[2] then
      return {v[1], v[2]}
    end
    return nil, "must be [low, high], two numbers with 0 < low <= high"
  elseif k == "resolution" then
    local w, h
    if math.type(v) == "integer" then
      w, h = v, v
    elseif type(v) == "table" and #v == 2 and math.type(v[1]) == "integer" and math.type(v[2]) == "integer" then
      w, h = v[1], v[2]
    else
      return nil, "must be a whole number of pixels or [width, height]"
    end
    if w < 1 or h < 1 then return nil, "must be positive" end
    return {w, h}
  end
  error("kohya_config: no check for " .. tostring(k))
end

-- a value the command line gave (ARGS, by ckrun's names) for key k, as the file would hold it
local function from_args(k, v)
  if k == "resolution" then
    if type(v) == "string" then
      local w, h = v:match("^%s*(%d+)%s*,%s*(%d+)%s*$")
      if w then return {math.tointeger(tonumber(w)), math.tointeger(tonumber(h))} end
      return math.tointeger(tonumber(v))
    elseif type(v) == "table" then
      local w, h = math.tointeger(tonumber(v[1])), math.tointeger(tonumber(v[2] or v[1]))
      return {w, h}
    end
  end
  return v
end

local function same(a, b)
  if type(a) == "table" and type(b) == "table" then
    if #a ~= #b then return false end
    for i = 1, #a do
      if a[i] ~= b[i] then return false end
    end
    return true
  end
  return a == b
end

function M.dataset(src, opts)
  opts = opts or {}
  local value, doc = load(src, opts.file, "dataset config")
  local where, name = doc.where, doc.name
  local args = opts.args or {}
  local supports
  if opts.supports then
    supports = {}
    for _, k in ipairs(opts.supports) do supports[k] = true end
  end

  -- one level's table: every key known, at its level, of its type
  local function level_keys(t, level, at_t, what)
    local out, whence = {}, {}
    if not doc.is_map(t) then fail(at_t, "%s must be a table, got %s", what, shown(t)) end
    for _, k in ipairs(doc.keys(t)) do
      local v, at = t[k], where(t, k)
      local spec = M.KEYS[k]
      if k == "subsets" and level == DATASET then
        -- read by the caller
      elseif OTHER_STYLES[k] then
        fail(at, "%s", OTHER_STYLES[k])
      elseif not spec then
        local near = nearest(k, KEY_NAMES)
        fail(at, "unknown key %s in %s%s", k, what, near and " (did you mean " .. near .. "?)" or "")
      elseif spec.at & level == 0 then
        fail(at, "%s is %s setting: it goes in %s, not in %s", k, spec.dataset == true and "a dataset's" or "a subset's own",
          places(spec.at), LEVEL_WORDS[level])
      else
        local x, why = check_type(spec.t, v)
        if x == nil then fail(at, "%s %s, got %s", k, why, shown(v)) end
        if supports and not supports[k] and not (spec.default ~= nil and same(x, spec.default)) then
          fail(at, "%s = %s is kohya's setting that ckrun's trainer does not take", k, shown(v))
        end
        out[k], whence[k] = x, at
      end
    end
    return out, whence
  end

  if not doc.is_map(value) then fail(name, "holds %s, where a dataset config is a table", shown(value)) end
  for _, k in ipairs(doc.keys(value)) do
    if k ~= "general" and k ~= "datasets" then
      local near = nearest(k, {"general", "datasets"})
      fail(where(value, k), "unknown key %s at the top of the dataset config (it holds [general] and [[datasets]])%s",
        k, near and " (did you mean " .. near .. "?)" or "")
    end
  end
  local general, general_at = {}, {}
  if value.general ~= nil then
    general, general_at = level_keys(value.general, GENERAL, where(value, "general"), "[general]")
  end
  local datasets = value.datasets
  if datasets == nil then fail(name, "no [[datasets]]: a dataset config lists its datasets and their subsets") end
  if type(datasets) ~= "table" or (doc.is_map(datasets) and next(datasets) ~= nil) then
    fail(where(value, "datasets"), "datasets must be an array of tables, [[datasets]], got %s", shown(datasets))
  end
  if #datasets == 0 then fail(where(value, "datasets"), "no datasets in [[datasets]]") end

  local d = {file = name, datasets = {}, subsets = {}, ignored = {}}
  -- a key's value and where it came from: the levels in order, then ARGS, then kohya's default
  local function resolve(k, levels)
    for _, l in ipairs(levels) do
      if l.values[k] ~= nil then return l.values[k], l.at[k] end
    end
    local a = args[arg_name(k)]
    if a ~= nil then
      local x, why = check_type(M.KEYS[k].t, from_args(k, a))
      if x == nil then fail("--" .. arg_name(k), "%s (kohya's %s) %s, got %s", arg_name(k), k, why, shown(a)) end
      return x, "--" .. arg_name(k)
    end
    local def = M.KEYS[k].default
    if type(def) == "table" then def = {table.unpack(def)} end
    return def, nil
  end

  for i, ds in ipairs(datasets) do
    local ds_at = where(datasets, i)
    local values, at = level_keys(ds, DATASET, ds_at, "[[datasets]]")
    local levels = {{values = values, at = at}, {values = general, at = general_at}}
    local dset = {at = ds_at, subsets = {}, from = {}}
    for k, s in pairs(M.KEYS) do
      if s.dataset then dset[k], dset.from[k] = resolve(k, levels) end
    end
    if not dset.resolution then
      fail(ds_at, "dataset %d has no resolution: give resolution = W or [W, H] in [general] or [[datasets]]%s", i,
        opts.args and " (or --resolution)" or "")
    end
    if dset.enable_bucket then
      -- kohya moves the bucket limits to multiples of the steps, then needs the resolution inside them
      local steps = dset.bucket_reso_steps
      local lo = dset.min_bucket_reso - dset.min_bucket_reso % steps
      local hi = dset.max_bucket_reso % steps == 0 and dset.max_bucket_reso or
        dset.max_bucket_reso + steps - dset.max_bucket_reso % steps
      if lo ~= dset.min_bucket_reso or hi ~= dset.max_bucket_reso then
        d.ignored[#d.ignored + 1] = string.format("%s: the bucket limits %d and %d are moved to %d and %d, multiples " ..
          "of bucket_reso_steps %d, as kohya does", dset.from.min_bucket_reso or dset.from.max_bucket_reso or ds_at,
          dset.min_bucket_reso, dset.max_bucket_reso, lo, hi, steps)
        dset.min_bucket_reso, dset.max_bucket_reso = lo, hi
      end
      local r = dset.resolution
      if math.min(r[1], r[2]) < lo or math.max(r[1], r[2]) > hi then
        fail(dset.from.resolution or ds_at, "resolution %dx%d does not fit the buckets' sides %d to %d (min_bucket_reso, " ..
          "max_bucket_reso)", r[1], r[2], lo, hi)
      end
    end
    local subs = ds.subsets
    if subs == nil or (type(subs) == "table" and next(subs) == nil) then
      fail(ds_at, "dataset %d has no subsets: give [[datasets.subsets]] with image_dir", i)
    end
    if type(subs) ~= "table" or doc.is_map(subs) then
      fail(where(ds, "subsets"), "subsets must be an array of tables, [[datasets.subsets]], got %s", shown(subs))
    end
    local dirs = {}
    for j, sub in ipairs(subs) do
      local sub_at = where(subs, j)
      local sv, sa = level_keys(sub, SUBSET, sub_at, "[[datasets.subsets]]")
      if sv.image_dir == nil then fail(sub_at, "subset %d of dataset %d has no image_dir", j, i) end
      local slevels = {{values = sv, at = sa}, levels[1], levels[2]}
      local s = {at = sub_at, dataset = i, from = {}}
      for k, spec in pairs(M.KEYS) do
        if spec.dataset == true then
          s[k], s.from[k] = dset[k], dset.from[k]
        else
          s[k], s.from[k] = resolve(k, slevels)
        end
      end
      if dirs[s.image_dir] then
        d.ignored[#d.ignored + 1] = string.format("%s: a second subset of image_dir '%s' in dataset %d (first at %s) " ..
          "is left out, as kohya does", sub_at, s.image_dir, i, dirs[s.image_dir])
      else
        dirs[s.image_dir] = sub_at
        d.subsets[#d.subsets + 1] = s
        dset.subsets[#dset.subsets + 1] = s
      end
    end
    d.datasets[i] = dset
  end
  return d
end

return M
