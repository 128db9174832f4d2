-- A script's --options, declared once: one table gives each option's name,
-- type, default and one-line description, and drives the parsing (unknown
-- options refused with the closest name), `ckrun SCRIPT --help`, and the
-- README's option lists (tests/sh/test_readme_options.sh checks them).
--
--   local o = options.parse(args, {
--     about = "what the script does, in a line",
--     {"steps", "integer", 300, "batches to train", min = 1},
--     {"size", "choice", "tiny", "the UNet", choices = {"tiny", "full"}},
--     {"alpha", "number", function(v) return v.rank end, "LoRA alpha", shown = "the rank"}, -- v: those above
--     {"batch", "integer", 2, "samples per step", min = 1, also = {"auto"}}, -- a word taken as it is
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

-- the declaration's entries, checked: {name, type, default, description, ...}
local function entries(spec)
  if type(spec) ~= "table" then error("options.parse: give the script's table of options", 3) end
  local list, by = {}, {}
  for i, e in ipairs(spec) do
    local name, ty, desc = e[1], e[2], e[4]
    local what = "options.parse: entry " .. i
    if type(name) ~= "string" or name == "" then error(what .. " has no name", 3) end
    what = "options.parse: --" .. name
    if by[name] then error(what .. " is declared twice", 3) end
    if name == "given" or name == "script" or name == "help" then error(what .. ": the name is reserved", 3) end
    if not M.types[ty] then error(what .. ": unknown type '" .. tostring(ty) .. "'", 3) end
    if type(desc) ~= "string" or desc == "" then error(what .. " has no description", 3) end
    if ty == "choice" and type(e.choices) ~= "table" then error(what .. ": a choice needs choices = {...}", 3) end
    if type(e[3]) == "function" and type(e.shown) ~= "string" then
      error(what .. ": a computed default needs shown = \"what it is\" for --help", 3)
    end
    local x = {name = name, type = ty, default = e[3], desc = desc, choices = e.choices, min = e.min, max = e.max,
               above = e.above, below = e.below, check = e.check, says = e.says, shown = e.shown, arg = e.arg,
               pos = e.pos, required = e.required, also = e.also, repeats = e.repeats}
    list[#list + 1], by[name] = x, x
  end
  return list, by
end

-- raw -> value through the entry's type and check (a word of the entry's also
-- list is taken as it is); nil and the message when it does not parse
local function convert(e, raw)
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

-- The text of `ckrun SCRIPT --help`.
function M.help(spec, script)
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
  for _, r in ipairs(rows) do w = math.max(w, #r[1]) end
  out[#out + 1] = ""
  out[#out + 1] = "options:"
  for _, r in ipairs(rows) do out[#out + 1] = string.format("  %-" .. w .. "s  %s", r[1], r[2]) end
  out[#out + 1] = "  --help" .. string.rep(" ", math.max(0, w - 6)) .. "  show this help and run nothing"
  return table.concat(out, "\n") .. "\n"
end

local Values = {}

-- o = M.parse(args, spec): the options' values by name, or nil after printing
-- the help for --help. Every value, given or default, goes through its type
-- and check. An option outside spec (a misspelt --max-grad-norm would
-- otherwise pass unnoticed) or a word without --name is refused, naming the
-- closest name; every error names the line of the script that called parse.
-- Reading a name spec lacks is an error at the reading line. An option given
-- twice is refused, unless its entry says repeats = true: its value is then
-- the list of what was given, in order (each through the type).
function M.parse(args, spec)
  local list, by = entries(spec)
  args = args or {}
  -- static defaults always, so that a bad one fails every run, given or not
  for _, e in ipairs(list) do
    if e.default ~= nil and type(e.default) ~= "function" then
      local _, why = convert(e, e.default)
      if why then error("options.parse: the default of --" .. e.name .. " does not parse: " .. why, 2) end
    end
  end
  if args.help ~= nil then
    io.write(M.help(spec, args.script))
    return nil
  end
  local bad, positional, names = {}, {}, {}
  for _, e in ipairs(list) do
    if e.pos then positional[e.pos] = e else names[#names + 1] = e.name end
  end
  for k, v in pairs(args) do
    if math.type(k) == "integer" then
      if not positional[k] then
        bad[#bad + 1] = string.format("unexpected argument '%s' (options are --name value)", tostring(v))
      end
    elseif k ~= "script" and (not by[k] or by[k].pos) then
      local best, bd = nil, math.huge
      for _, n in ipairs(names) do
        local d = distance(k, n)
        if d < bd then best, bd = n, d end
      end
      local hint = ""
      if CKRUN[k] then
        hint = " (a ckrun option: put ckrun's options before the script)"
      elseif best and bd <= math.max(2, #k // 3) then
        hint = " (did you mean --" .. best .. "?)"
      end
      bad[#bad + 1] = string.format("unknown option --%s%s", k, hint)
    end
  end
  -- an option given more than once (the host lists its values in
  -- getmetatable(args).repeated): a list for one that repeats, else refused
  if #bad > 0 then
    table.sort(bad)
    local known = #names > 0 and "; the options are --" .. table.concat(names, ", --") or "; it takes no options"
    error(table.concat(bad, "; ") .. known, 2)
  end
  local mt = getmetatable(args)
  local repeated = type(mt) == "table" and type(rawget(mt, "repeated")) == "table" and rawget(mt, "repeated") or {}
  for k, vals in pairs(repeated) do
    if by[k] and not by[k].pos and not by[k].repeats then
      local shown = {}
      for i, v in ipairs(vals) do shown[i] = "'" .. tostring(v) .. "'" end
      bad[#bad + 1] = string.format("--%s is given %d times (%s): give it once", k, #vals, table.concat(shown, ", "))
    end
  end
  if #bad > 0 then
    table.sort(bad)
    error(table.concat(bad, "; "), 2)
  end
  local values, given, done = {}, {}, {}
  -- what a computed default sees: the options above it
  local above = setmetatable({}, {__index = function(_, k)
    if not done[k] then error("options.parse: a default reads --" .. tostring(k) .. ", which is not declared above it", 2) end
    return values[k]
  end})
  for _, e in ipairs(list) do
    local raw
    if e.pos then raw = args[e.pos] else raw = args[e.name] end
    given[e.name] = raw ~= nil
    if raw == nil then
      raw = e.default
      if type(raw) == "function" then raw = raw(above) end
    end
    if e.repeats and raw ~= nil then -- a list: each value given, in order, through the type
      local list = given[e.name] and (repeated[e.name] or {raw}) or (type(raw) == "table" and raw or {raw})
      local vs = {}
      for i, r in ipairs(list) do
        local v, why = convert(e, r)
        if why then error(given[e.name] and why or "the default of " .. why, 2) end
        vs[i] = v
      end
      values[e.name] = vs
    elseif raw == nil then
      if e.required then
        local why = (e.pos and (metavar(e) or e.name:upper()) or "--" .. e.name) .. " is required"
        error(why .. " (" .. (args.script or "the script") .. " --help lists the options)", 2)
      end
    else
      local v, why = convert(e, raw)
      if why then
        if not given[e.name] then why = "the default of " .. why end
        error(why, 2)
      end
      values[e.name] = v
    end
    done[e.name] = true
  end
  return setmetatable(values, {
    __index = function(_, k)
      if by[k] then return nil end
      if k == "given" then return Values.given end
      error("option --" .. tostring(k) .. " is read but not in the script's list of options", 2)
    end,
    given = given,
  })
end

-- whether the command line gave --name (not its default)
function Values.given(o, name)
  local g = getmetatable(o).given
  if g[name] == nil then error("option --" .. tostring(name) .. " is not in the script's list of options", 2) end
  return g[name]
end

return M
