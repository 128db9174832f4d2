-- A script's --options, declared once: one table gives each option's name,
-- type, default and one-line description, and drives the parsing (unknown
-- options refused with the nearest name; kohya's spellings taken where the
-- table says kohya = true), `ckrun SCRIPT --help`, and the README's option
-- lists (tests/sh/test_readme_options.sh checks them).
--
--   local o = options.parse(args, {
--     about = "what the script does, in a line", kohya = true,
--     {"steps", "integer", 300, "batches to train", min = 1},
--     {"size", "choice", "tiny", "the UNet", choices = {"tiny", "full"}},
--     {"alpha", "number", function(v) return v.rank end, "LoRA alpha", shown = "the rank"}, -- v: all values
--     {"batch", "integer", 2, "samples per step", min = 1, also = {"auto"}}, -- a word taken as it is
--     {"res", "integer", 256, "pixels", accept = function(raw) return raw end}, -- another spelling, rewritten
--                                    -- before the type (or nil and what is wrong, after "--res ")
--     {heading = "the model"},       -- --help shows the options after it under these words
--   })
--   if not o then return end -- --help printed the options
--   print(o.steps, o["max-grad-norm"], o:given("size"))
local M = {}

-- ckrun's own options (vm/cli/main.c's usage, `ckrun --help`; kept equal by
-- tests/sh/test_readme_options.sh): given after the script they reach it as
-- its arguments, so an unknown one gets a hint. --help is left out: after the
-- script it asks for the script's help.
M.CKRUN_OPTIONS = {"version", "plan", "json", "nondeterministic", "policies", "max-batch", "world-size", "svg", "export-graph", "allow-read",
                   "allow-write", "trust", "max-heap", "max-memory", "callback-budget", "device"}
local CKRUN = {}
for _, n in ipairs(M.CKRUN_OPTIONS) do CKRUN[n] = true end

-- Edits (insertions, deletions, substitutions) between strings a and b.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = {[0] = i}
    for j = 1, #b do
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a:byte(i) == b:byte(j) and 0 or 1))
    end
    prev = cur
  end
  return prev[#b]
end
M.distance = distance

local function got(v) return ", got '" .. tostring(v) .. "'" end

-- s without leading and trailing spaces, in time linear in #s (the pattern
-- "^%s*(.-)%s*$" backtracks over a run of spaces from each of its characters)
local function trim(s)
  local a = s:find("%S")
  return a and s:match(".*%S", a) or ""
end

-- a number's range in words: [min, below), > above, >= min
local function range(e)
  if e.min and e.below then return string.format(" in [%s, %s)", e.min, e.below) end
  if e.above then return " > " .. e.above end
  if e.min then return " >= " .. e.min end
  if e.max then return " <= " .. e.max end
  return ""
end

local function in_range(e, v)
  return (e.min == nil or v >= e.min) and (e.max == nil or v <= e.max) and (e.above == nil or v > e.above)
    and (e.below == nil or v < e.below)
end

-- type -> function(entry, raw) returning the value, or nil and what is wrong
-- (after "--name ")
M.types = {
  string = function(_, v)
    if type(v) == "string" or type(v) == "number" then return tostring(v) end
    return nil, "wants a value" .. got(v)
  end,
  integer = function(e, v)
    if math.type(v) == "integer" and in_range(e, v) then return v end
    return nil, "must be an integer" .. range(e) .. got(v)
  end,
  number = function(e, v)
    if type(v) == "number" and in_range(e, v) then return v end
    return nil, "must be a number" .. range(e) .. got(v)
  end,
  flag = function(_, v)
    if v == true or v == "true" or v == 1 or v == "yes" then return true end
    if v == false or v == "false" or v == 0 or v == "no" then return false end
    return nil, "must be true or false" .. got(v)
  end,
  choice = function(e, v)
    for _, c in ipairs(e.choices) do
      if v == c then return v end
    end
    return nil, "must be " .. table.concat(e.choices, " or ") .. got(v)
  end,
  -- a comma-separated list, entries trimmed
  list = function(_, v)
    if type(v) ~= "string" and type(v) ~= "number" then return nil, "wants a comma-separated list" .. got(v) end
    local out = {}
    for s in tostring(v):gmatch("[^,]+") do out[#out + 1] = trim(s) end
    return out
  end,
  -- bytes: a number, or with a unit ("24 GiB", "512MiB"), as ck.policy.bytes reads it
  size = function(_, v)
    local ok, b = pcall(require("ck.policy").bytes, v)
    if ok then return b end
    return nil, "must be a size such as 512MiB or 24 GiB" .. got(v)
  end,
  -- a lone --flag, or a value (--resume [DIR])
  ["flag-or-string"] = function(_, v)
    if v == true or v == "true" then return true end
    if v == false or v == "false" then return false end
    if type(v) == "string" or type(v) == "number" then return tostring(v) end
    return nil, "wants true, false or a value" .. got(v)
  end,
}

-- for an option that names a file to write (check = options.file_to_write,
-- says = options.FILE_TO_WRITE): false for a path that names a directory,
-- spelled as one (a trailing '/', a last "." or "..") or one that exists, so
-- the run is refused before its work, not at its end
function M.file_to_write(v)
  v = tostring(v)
  if v == "" or v:sub(-1) == "/" or v:match("/%.%.?$") or v == "." or v == ".." then return false end
  local ok, names = pcall(require("ck").listdir, v)
  return not (ok and names)
end
M.FILE_TO_WRITE = "must name a file to write, not a directory"

local METAVAR = {string = "VALUE", size = "SIZE", integer = "N", number = "X", list = "LIST", ["flag-or-string"] = "[VALUE]"}

-- an error of the parser's own, raised at the line that called parse
local Refusal = {}
local function refuse(msg) error(setmetatable({msg = msg}, Refusal), 0) end

-- the declaration's entries, checked: {name, type, default, description, ...}
local function entries(spec)
  if type(spec) ~= "table" then refuse("options.parse: give the script's table of options") end
  local list, by = {}, {}
  local heading
  for i, e in ipairs(spec) do
    if type(e) == "table" and e.heading ~= nil then
      if type(e.heading) ~= "string" then refuse("options.parse: entry " .. i .. ": a heading is a string") end
      heading = e.heading
      goto next
    end
    local name, ty, desc = e[1], e[2], e[4]
    local what = "options.parse: entry " .. i
    if type(name) ~= "string" or name == "" then refuse(what .. " has no name") end
    what = "options.parse: --" .. name
    if by[name] then refuse(what .. " is declared twice") end
    if name == "given" or name == "script" or name == "help" then refuse(what .. ": the name is reserved") end
    if not M.types[ty] then refuse(what .. ": unknown type '" .. tostring(ty) .. "'") end
    if type(desc) ~= "string" or desc == "" then refuse(what .. " has no description") end
    if ty == "choice" and type(e.choices) ~= "table" then refuse(what .. ": a choice needs choices = {...}") end
    if type(e[3]) == "function" and type(e.shown) ~= "string" then
      refuse(what .. ": a computed default needs shown = \"what it is\" for --help")
    end
    local x = {name = name, type = ty, default = e[3], desc = desc, choices = e.choices, min = e.min, max = e.max,
               above = e.above, below = e.below, check = e.check, says = e.says, shown = e.shown, arg = e.arg,
               pos = e.pos, required = e.required, also = e.also, repeats = e.repeats, accept = e.accept,
               heading = heading}
    heading = nil
    list[#list + 1], by[name] = x, x
    ::next::
  end
  return list, by
end

-- raw -> value through the entry's type and check (a word of the entry's also
-- list is taken as it is); nil and the message when it does not parse
local function convert(e, raw)
  if e.accept then
    local why
    raw, why = e.accept(raw)
    if raw == nil then return nil, "--" .. e.name .. " " .. tostring(why) end
  end
  for _, w in ipairs(e.also or {}) do
    if raw == w then return w end
  end
  local v, why = M.types[e.type](e, raw)
  if v ~= nil and e.check and not e.check(v) then v, why = nil, "is not allowed" .. got(raw) end
  if v == nil and e.says then why = e.says .. ", got " .. tostring(raw) end
  if v == nil and e.also then why = (why:gsub(", got ", " or " .. table.concat(e.also, " or ") .. ", got ", 1)) end
  if v == nil then return nil, "--" .. e.name .. " " .. why end
  return v
end

local function metavar(e)
  if e.arg then return e.arg end
  if e.type == "choice" then return table.concat(e.choices, "|") end
  if e.also then return table.concat({METAVAR[e.type], table.unpack(e.also)}, "|") end
  return METAVAR[e.type]
end

local function shown_default(e)
  if e.shown then return e.shown end
  local d = e.default
  if d == nil then return nil end
  return tostring(d)
end

local function help(spec, script)
  local list = entries(spec)
  local usage, named = {}, {}
  for _, e in ipairs(list) do
    if e.pos then
      usage[#usage + 1] = metavar(e) or e.name:upper()
    else
      named[#named + 1] = e
    end
  end
  local out = {string.format("usage: ckrun [ckrun options] %s%s [--option value ...]", script or "SCRIPT.lua",
    #usage > 0 and " " .. table.concat(usage, " ") or "")}
  if spec.about then out[#out + 1] = spec.about end
  local rows = {}
  local function row(left, e)
    local d = shown_default(e)
    if e.heading then rows[#rows + 1] = {heading = e.heading} end
    rows[#rows + 1] = {left, e.desc .. (d and " (default: " .. d .. ")" or "")}
  end
  for _, e in ipairs(list) do
    if e.pos then row(metavar(e) or e.name:upper(), e) end
  end
  for _, e in ipairs(named) do
    local mv = metavar(e)
    row("--" .. e.name .. (mv and " " .. mv or ""), e)
  end
  local w = 0
  for _, r in ipairs(rows) do w = math.max(w, r[1] and #r[1] or 0) end
  out[#out + 1] = ""
  out[#out + 1] = "options:"
  for _, r in ipairs(rows) do
    out[#out + 1] = r.heading and " " .. r.heading .. ":" or string.format("  %-" .. w .. "s  %s", r[1], r[2])
  end
  out[#out + 1] = "  --help" .. string.rep(" ", math.max(0, w - 6)) .. "  show this help and run nothing"
  return table.concat(out, "\n") .. "\n"
end

-- The text of `ckrun SCRIPT --help`.
function M.help(spec, script)
  local ok, r = pcall(help, spec, script)
  if ok then return r end
  if getmetatable(r) == Refusal then error(r.msg, 2) end
  error(r, 0)
end

local Values = {}

-- kohya's sd-scripts spell options with underscores (train_network.py,
-- sdxl_train_network.py, library/train_util.py). A script whose table says
-- kohya = true takes them: --max_grad_norm is --max-grad-norm wherever the
-- dashed name is declared, and the names below are taken as the ckrun option
-- they name (to), with a fixed value (value: kohya's flag for a choice) or
-- lowercased (lower: kohya's optimizer class names). A name whose meaning
-- differs from every ckrun option is refused with says: what ckrun has in its
-- place, in one line. An entry counts only where the script declares its to.
-- The dashed spelling of each name is taken the same way.
M.KOHYA = {
  learning_rate = {to = "lr"},
  unet_lr = {to = "lr"},
  train_batch_size = {to = "batch"},
  network_dim = {to = "rank"},
  network_alpha = {to = "alpha"},
  train_data_dir = {to = "data"},
  lr_scheduler_num_cycles = {to = "lr-num-cycles"},
  lr_scheduler_power = {to = "lr-power"},
  fused_backward_pass = {to = "fused-backward"},
  save_every_n_steps = {to = "save-lora-every"},
  sample_every_n_steps = {to = "sample-every"},
  caption_extention = {to = "caption-extension"}, -- kohya's older spelling
  optimizer_type = {to = "optimizer", lower = true},
  use_8bit_adam = {to = "optimizer", value = "adamw8bit"},
  use_lion_optimizer = {to = "optimizer", value = "lion"},
  v_parameterization = {to = "prediction", value = "v"},
  -- kohya's activation offload: the inputs of the checkpointed blocks, what the policy keeps
  cpu_offload_checkpointing = {to = "offload", value = "activations"},
  -- kohya's block swap: the last blocks' frozen weights streamed from pinned host memory (its Flux count)
  blocks_to_swap = {to = "blocks-to-swap"},
  -- kohya's gradient checkpointing is diffusers' (every block of the UNet)
  gradient_checkpointing = {to = "checkpoint", value = "diffusers"},
  max_train_steps = {to = "steps", says = "it counts updates; ckrun's --steps counts batches (updates times " ..
    "--gradient-accumulation-steps)"},
  max_train_epochs = {to = "steps", says = "ckrun counts --steps (batches)"},
  output_dir = {to = "out", says = "ckrun writes one file: --out OUTPUT_DIR/OUTPUT_NAME.safetensors"},
  output_name = {to = "out", says = "ckrun writes one file: --out OUTPUT_DIR/OUTPUT_NAME.safetensors"},
  logging_dir = {to = "log-dir", says = "ckrun's --log-dir DIR is the run's own folder (kohya makes one inside it)"},
  save_state = {to = "save-every", says = "ckrun writes training states every --save-every N steps"},
  save_every_n_epochs = {to = "save-lora-every", says = "ckrun writes the adapter every --save-lora-every N steps"},
  sample_every_n_epochs = {to = "sample-every", says = "ckrun renders samples every --sample-every N steps"},
  network_args = {to = "rank", says = "conv_dim and conv_alpha are --conv-rank and --conv-alpha, " ..
    "loraplus_lr_ratio is --loraplus-lr-ratio"},
  network_module = {to = "rank", says = "ckrun trains kohya's networks.lora (LoCon with --conv-rank); leave it out"},
  network_train_unet_only = {to = "rank", says = "ckrun trains adapters of the denoiser alone; leave it out"},
  optimizer_args = {to = "optimizer", says = "weight_decay=X is --weight-decay X"},
  cache_latents = {to = "cache-latents-to-disk",
                   says = "ckrun always caches the latents (on disk), unless --random-crop"},
  full_bf16 = {to = "mixed-precision", says = "ckrun keeps trainable weights in fp32; --mixed-precision bf16 stores " ..
    "the rest in bf16"},
  full_fp16 = {to = "mixed-precision", says = "ckrun keeps trainable weights in fp32; --mixed-precision fp16 stores " ..
    "the rest in fp16"},
  xformers = {to = "checkpoint", says = "ckrun's attention needs no switch; leave it out"},
  sdpa = {to = "checkpoint", says = "ckrun's attention needs no switch; leave it out"},
  mem_eff_attn = {to = "checkpoint", says = "ckrun's attention needs no switch; leave it out"},
}

local function dashed(k) return (k:gsub("_", "-")) end

local KOHYA_DASHED = {}
for k, v in pairs(M.KOHYA) do KOHYA_DASHED[dashed(k)] = {name = k, entry = v} end

-- more options than this and an unknown one without a near name points to
-- --help instead of listing them all
local LIST_AT_MOST = 12

local function parse(args, spec)
  local list, by = entries(spec)
  args = args or {}
  -- static defaults always, so that a bad one fails every run, given or not
  for _, e in ipairs(list) do
    if e.default ~= nil and type(e.default) ~= "function" then
      local _, why = convert(e, e.default)
      if why then refuse("options.parse: the default of --" .. e.name .. " does not parse: " .. why) end
    end
  end
  if args.help ~= nil then
    io.write(help(spec, args.script))
    return nil
  end
  local bad, positional, names = {}, {}, {}
  for _, e in ipairs(list) do
    if e.pos then positional[e.pos] = e else names[#names + 1] = e.name end
  end
  local kohya = spec.kohya and KOHYA_DASHED or {}
  local function declared(n) return by[n] and not by[n].pos end
  -- the names given, each resolved to the option it gives: {option, how}
  -- (how: nil for its own name, else the kohya entry or the underscore spelling)
  local via = {}
  local hinted = true
  for k, v in pairs(args) do
    if math.type(k) == "integer" then
      if not positional[k] then
        bad[#bad + 1] = string.format("unexpected argument '%s' (options are --name value)", tostring(v))
        hinted = false
      end
    elseif k ~= "script" and not declared(k) then
      local d = dashed(tostring(k))
      local ko = kohya[d]
      if ko and declared(ko.entry.to) and not ko.entry.says then
        via[k] = {ko.entry.to, ko.entry, ko.name}
      elseif declared(d) then
        via[k] = {d}
      elseif ko and declared(ko.entry.to) then
        bad[#bad + 1] = string.format("--%s is kohya's option: %s", k, ko.entry.says)
      else
        -- the nearest declared name, or kohya's name of one (then the
        -- option it stands for), spelt with dashes
        local best, bd = nil, math.huge
        for _, n in ipairs(names) do
          local dist = distance(d, n)
          if dist < bd then best, bd = n, dist end
        end
        local kbest, kd = nil, math.huge
        for name, kv in pairs(kohya) do
          if declared(kv.entry.to) then
            local dist = distance(d, name)
            if dist < kd or (dist == kd and name < kbest) then kbest, kd = name, dist end
          end
        end
        if kd < bd then best, bd = kohya[kbest].entry.to, kd end
        local hint = ""
        if CKRUN[k] then
          hint = " (a ckrun option: put ckrun's options before the script)"
        elseif best and bd <= math.max(2, #d // 3) then
          hint = " (did you mean --" .. best .. "?)"
        else
          hinted = false
        end
        bad[#bad + 1] = string.format("unknown option --%s%s", k, hint)
      end
    end
  end
  if #bad > 0 then
    table.sort(bad)
    local known = ""
    if hinted then
      known = ""
    elseif #names == 0 then
      known = "; it takes no options"
    elseif #names <= LIST_AT_MOST then
      known = "; the options are --" .. table.concat(names, ", --")
    else
      known = string.format("; `ckrun %s --help` lists its %d options", args.script or "SCRIPT", #names)
    end
    refuse(table.concat(bad, "; ") .. known)
  end
  -- an option given more than once (the host lists its values in
  -- getmetatable(args).repeated): a list for one that repeats, else refused;
  -- and an option given under two names (--lr and kohya's --learning_rate)
  local mt = getmetatable(args)
  local repeated = type(mt) == "table" and type(rawget(mt, "repeated")) == "table" and rawget(mt, "repeated") or {}
  for k, vals in pairs(repeated) do
    local e = by[via[k] and via[k][1] or k]
    if e and not e.pos and not e.repeats then
      local shown = {}
      for i, v in ipairs(vals) do shown[i] = "'" .. tostring(v) .. "'" end
      bad[#bad + 1] = string.format("--%s is given %d times (%s): give it once", k, #vals, table.concat(shown, ", "))
    end
  end
  local raws, spelt = {}, {}
  for k, v in pairs(args) do
    if k ~= "script" and math.type(k) ~= "integer" then
      local name, how = k, nil
      if via[k] then name, how = via[k][1], via[k][2] end
      if how and how.value ~= nil then -- kohya's flag for a value of a ckrun option
        local on = M.types.flag(nil, v)
        if on == nil then
          bad[#bad + 1] = string.format("--%s is a flag (kohya's; ckrun's --%s %s)", k, name, how.value)
        end
        v = on and how.value or nil
      elseif how and how.lower and type(v) == "string" then
        v = v:lower()
      end
      if v ~= nil then
        if spelt[name] then
          local a, b = spelt[name], k
          if a > b then a, b = b, a end
          bad[#bad + 1] = string.format("--%s and --%s are given, which name one option (--%s): give one", a, b, name)
        end
        raws[name], spelt[name] = v, k
      end
    end
  end
  if #bad > 0 then
    table.sort(bad)
    refuse(table.concat(bad, "; "))
  end
  local values, given, done, busy = {}, {}, {}, {}
  -- e's value: given, or its default (computed from the other options' values,
  -- in any order; a default that reads its own option's, at any depth, is refused)
  local value_of
  local others = setmetatable({}, {__index = function(_, k)
    if not by[k] then refuse("options.parse: a default reads --" .. tostring(k) .. ", which is not declared") end
    return value_of(by[k])
  end})
  function value_of(e)
    if done[e.name] then return values[e.name] end
    if busy[e.name] then
      refuse("options.parse: the default of --" .. e.name .. " reads itself (through the defaults it reads)")
    end
    busy[e.name] = true
    local raw
    if e.pos then raw = args[e.pos] else raw = raws[e.name] end
    given[e.name] = raw ~= nil
    -- what a value given under another name says of itself
    local as = spelt[e.name] and spelt[e.name] ~= e.name and spelt[e.name]
    if raw == nil then
      raw = e.default
      if type(raw) == "function" then raw = raw(others) end
    end
    if e.repeats and raw ~= nil then -- a list: each value given, in order, through the type
      local l = given[e.name] and (repeated[spelt[e.name] or e.name] or {raw}) or (type(raw) == "table" and raw or {raw})
      local vs = {}
      for i, r in ipairs(l) do
        local v, why = convert(e, r)
        if why then refuse(given[e.name] and why or "the default of " .. why) end
        vs[i] = v
      end
      values[e.name] = vs
    elseif raw == nil then
      if e.required then
        local why = (e.pos and (metavar(e) or e.name:upper()) or "--" .. e.name) .. " is required"
        refuse(why .. " (" .. (args.script or "the script") .. " --help lists the options)")
      end
    else
      local v, why = convert(e, raw)
      if why then
        if as then why = "--" .. as .. " (" .. why:sub(3):gsub("^(%S+)", "--%1)", 1) end
        if not given[e.name] then why = "the default of " .. why end
        refuse(why)
      end
      values[e.name] = v
    end
    done[e.name], busy[e.name] = true, nil
    return values[e.name]
  end
  for _, e in ipairs(list) do value_of(e) end
  return setmetatable(values, {
    __index = function(_, k)
      if by[k] then return nil end
      if k == "given" then return Values.given end
      error("option --" .. tostring(k) .. " is read but not in the script's list of options", 2)
    end,
    given = given,
  })
end

-- o = M.parse(args, spec): the options' values by name, or nil after printing
-- the help for --help. Every value, given or default, goes through its type
-- and check; a computed default reads the other options' values (given or
-- their defaults, declared anywhere in spec). An option outside spec (a
-- misspelt --max-grad-norm would otherwise pass unnoticed) or a word without
-- --name is refused, naming the nearest name (by edit distance, kohya's names
-- included where spec.kohya): the list of options only when no unknown one
-- has a near name. Every error names the line of the script that called parse.
-- Reading a name spec lacks is an error at the reading line. An option given
-- twice is refused, unless its entry says repeats = true: its value is then
-- the list of what was given, in order (each through the type).
function M.parse(args, spec)
  local ok, r = pcall(parse, args, spec)
  if ok then return r end
  if getmetatable(r) == Refusal then error(r.msg, 2) end
  error(r, 0) -- a default's own error, with its own line
end

-- whether the command line gave --name (not its default)
function Values.given(o, name)
  local g = getmetatable(o).given
  if g[name] == nil then error("option --" .. tostring(name) .. " is not in the script's list of options", 2) end
  return g[name]
end

return M
