-- string.rep, string.format and table.concat refuse a result that the Lua
-- heap limit (1 GiB in the sandbox) cannot hold, before building it, with one
-- line that names the script line; results they can build are Lua's. The
-- pattern functions' errors name the script line too, and table.sort's own
-- heap sort for big tables (which charges its work) sorts as Lua's does.
package.path = "tests/lua/?.lua;" .. package.path
local T = require "check"

local function line() return debug.getinfo(2, "l").currentline end
local function err_of(f)
  local ok, e = pcall(f)
  return not ok and tostring(e) or nil
end
-- e is the error "<this file>:<at>: <msg>"
local function says(e, at, msg)
  return e ~= nil and e:find("test_string_limits.lua:" .. at .. ": " .. msg, 1, true) ~= nil and
    e:sub(-#msg) == msg
end
-- e is an error at that line that ends in msg
local function ends(e, at, msg)
  return e ~= nil and e:find("test_string_limits.lua:" .. at .. ": ", 1, true) ~= nil and e:sub(-#msg) == msg
end

local MiB = 2^20
local big = ("x"):rep(16 * MiB)

-- string.rep
do
  local c = os.clock()
  local at, e = line(), err_of(function() return ("x"):rep(2^33) end)
  T.ok(says(e, at, "string.rep: out of memory: a result of 8 GiB passes the Lua heap limit of 1 GiB"), "rep: 8 GiB is refused (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() return ("ab"):rep(2^62) end)
  T.ok(says(e, at, "string.rep: out of memory: a result of 8 EiB passes the Lua heap limit of 1 GiB"), "rep: 2^63 bytes, past size_t arithmetic, is refused (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() return (""):rep(2^31, "ab") end)
  T.ok(says(e, at, "string.rep: out of memory: a result of 4.0 GiB passes the Lua heap limit of 1 GiB"), "rep: separators alone count (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() return ("abc"):rep(math.maxinteger, "de") end)
  T.ok(ends(e, at, "passes the Lua heap limit of 1 GiB"), "rep: math.maxinteger copies with a separator (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() return ("x"):rep(700 * MiB) end)
  T.ok(e and e:find("test_string_limits.lua:" .. at .. ": string.rep: out of memory: a result of 700 MiB needs 1.4 GiB to build, which passes the Lua heap limit of 1 GiB (", 1, true) ~= nil,
    "rep: a result under the limit whose buffer and string together pass it (" .. tostring(e) .. ")")
  T.ok(os.clock() - c < 0.5, ("rep: the five are refused before anything is built (%.3f s)"):format(os.clock() - c))
  local bad = nil
  for _, s in ipairs{"", "a", "xyz"} do
    for _, sep in ipairs{"", ",", "--"} do
      for n = -1, 7 do
        local want = {}
        for i = 1, n do want[#want + 1] = s end
        want = table.concat(want, sep)
        if s:rep(n, sep) ~= want then bad = ("%q:rep(%d, %q)"):format(s, n, sep) end
      end
    end
  end
  T.ok(bad == nil, "rep: 81 small results equal those built by hand (" .. tostring(bad) .. ")")
  local r = ("abc"):rep(1234567, "de")
  T.ok(#r == 1234567 * 3 + 1234566 * 2 and r:sub(1, 10) == "abcdeabcde" and r:sub(-8) == "abcdeabc" and
    r:sub(5 * 777777 + 1, 5 * 777777 + 5) == "abcde", "rep: a 6 MiB result built a chunk at a time is periodic end to end")
end

-- string.format
do
  local refs = {}
  for i = 1, 100 do refs[i] = big end
  local c = os.clock()
  local at, e = line(), err_of(function() return string.format(("%s"):rep(100), table.unpack(refs)) end)
  T.ok(says(e, at, "string.format: out of memory: a result of 1.6 GiB passes the Lua heap limit of 1 GiB"), "format: 100 %s of 16 MiB are refused (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() return string.format(("%q"):rep(70), table.unpack(refs, 1, 70)) end)
  T.ok(ends(e, at, "passes the Lua heap limit of 1 GiB"), "format: %q counts its quotes (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() return string.format(("ab%-20s"):rep(70), table.unpack(refs, 1, 70)) end)
  T.ok(ends(e, at, "passes the Lua heap limit of 1 GiB"), "format: %s with a width and text around (" .. tostring(e) .. ")")
  T.ok(os.clock() - c < 0.5, ("format: refused before anything is built (%.3f s)"):format(os.clock() - c))
  T.ok(#string.format(("%.1s"):rep(100), table.unpack(refs)) == 100, "format: a precision that cuts each big string lets it through")
  local s = string.format("%.3s|%5s|%-5d|%5.1f|%x|%q|%%|%c", "abcdef", "x", 3, 2.5, 255, "a\nb", 65)
  T.ok(s == 'abc|    x|3    |  2.5|ff|"a\\\nb"|%|A', "format: Lua's own results (" .. s .. ")")
  at, e = line(), err_of(function() return string.format("%d", "x") end)
  T.ok(says(e, at, "bad argument #2 to 'format' (number expected, got string)"), "format: Lua's errors name the script line (" .. tostring(e) .. ")")
end

-- table.concat
do
  local refs = {}
  for i = 1, 100 do refs[i] = big end
  local c = os.clock()
  local at, e = line(), err_of(function() return table.concat(refs) end)
  T.ok(says(e, at, "table.concat: out of memory: a result of 1.6 GiB passes the Lua heap limit of 1 GiB"), "concat: 100 strings of 16 MiB are refused (" .. tostring(e) .. ")")
  local small = {}
  for i = 1, 100 do small[i] = "a" end
  at, e = line(), err_of(function() return table.concat(small, big) end)
  T.ok(ends(e, at, "passes the Lua heap limit of 1 GiB"), "concat: a 16 MiB separator between 100 strings (" .. tostring(e) .. ")")
  T.ok(os.clock() - c < 0.5, ("concat: refused before anything is built (%.3f s)"):format(os.clock() - c))
  local calls = 0
  local proxy = setmetatable({}, {__index = function(_, i) calls = calls + 1; return big end, __len = function() return 100 end})
  at, e = line(), err_of(function() return table.concat(proxy) end)
  T.ok(e and e:find("test_string_limits.lua:" .. at .. ": table.concat: out of memory: a result of ", 1, true) and
    e:find("passes the Lua heap limit of 1 GiB", 1, true) and calls < 100,
    ("concat: through __index, refused once what is built passes the limit (%d of 100 read: %s)"):format(calls, tostring(e)))
  T.ok(table.concat({1, 2.5, "x"}, "-") == "1-2.5-x", "concat: numbers as Lua writes them")
  T.ok(table.concat({"a", "b", "c", "d"}, ",", 2, 3) == "b,c" and table.concat({"a"}, ",", 3, 2) == "" and
    table.concat({}) == "", "concat: i and j, an empty range")
  T.ok(table.concat(setmetatable({}, {__index = function(_, i) return "p" .. i end, __len = function() return 3 end})) == "p1p2p3",
    "concat: reads through __index and __len, as Lua 5.4 does")
  local t = {[math.maxinteger - 1] = "y", [math.maxinteger] = "z"}
  T.ok(table.concat(t, "", math.maxinteger - 1, math.maxinteger) == "yz", "concat: a range that ends at math.maxinteger")
  at, e = line(), err_of(function() return table.concat({"a", {}, "c"}) end)
  T.ok(says(e, at, "invalid value (at index 2) in table for 'concat'"), "concat: a table among the values (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() return table.concat(42) end)
  T.ok(ends(e, at, "(table expected, got number)"), "concat: not a table (" .. tostring(e) .. ")")
end

-- the .. operator is held by the heap limit itself
do
  local s = ("x"):rep(300 * MiB)
  local ok, e = pcall(function() return s .. s .. s end)
  T.ok(not ok and tostring(e):find("not enough memory", 1, true), "..: 900 MiB more is refused by the heap limit (" .. tostring(e) .. ")")
  s = nil
  collectgarbage()
end

-- the pattern functions' errors
do
  local cases = {
    {function() return ("a"):find("%f") end, "missing '[' after '%f' in pattern"},
    {function() return ("a"):match("[a") end, "malformed pattern (missing ']')"},
    {function() return ("a"):match("a%") end, "malformed pattern (ends with '%')"},
    {function() return ("a"):gsub("a", "%2") end, "invalid capture index %2"},
    {function() return ("a"):gsub(".", "%") end, "invalid use of '%' in replacement string"},
    {function() return ("a"):find("(a") end, "unfinished capture"},
    {function() return ("a"):find(".)") end, "invalid pattern capture"},
    {function() return ("a"):find("%b(") end, "malformed pattern (missing arguments to '%b')"},
    {function() return ("a"):rep(300):find(("a?"):rep(300)) end, "pattern too complex"},
    {function() return ("a"):rep(40):find(("(a)"):rep(33)) end, "too many captures"},
    {function() for k in ("a"):gmatch("(%1)") do end end, "invalid capture index %1"},
  }
  for _, c in ipairs(cases) do
    local info = debug.getinfo(c[1], "S")
    local e = err_of(c[1])
    T.ok(says(e, info.linedefined, c[2]), "pattern error at the script line: " .. c[2] .. " (" .. tostring(e) .. ")")
  end
  local e = err_of(function() return ("a"):gsub("a", {a = {}}) end)
  T.ok(e and e:find("invalid replacement value (a table)", 1, true), "gsub: a table as a replacement value (" .. tostring(e) .. ")")
end

-- a gmatch iterator made in one coroutine and run in another
do
  local it = ("k=v, a=b"):gmatch("(%w+)=(%w+)")
  local got = {}
  coroutine.wrap(function() for k, v in it do got[#got + 1] = k .. v; coroutine.yield() end end)()
  local k, v = it()
  T.ok(got[1] == "kv" and k == "a" and v == "b", "gmatch: an iterator runs in any coroutine")
  local r = ("hello world"):gsub("o", setmetatable({}, {__index = function(_, k) return "0" end}))
  T.ok(r == "hell0 w0rld", "gsub: a replacement table's __index is used")
end

-- table.sort past 65536 elements
do
  local r = T.rng(7)
  local n = 200003
  local t, count = {}, {}
  for i = 1, n do
    local v = math.floor((r() + 1) * 5000)
    t[i] = v
    count[v] = (count[v] or 0) + 1
  end
  table.sort(t)
  local sorted, same = true, true
  for i = 2, n do if t[i - 1] > t[i] then sorted = false end end
  for i = 1, n do count[t[i]] = count[t[i]] - 1 end
  for _, c in pairs(count) do if c ~= 0 then same = false end end
  T.ok(#t == n and sorted and same, "sort: 200003 numbers with ties come out in order, each value as often as before")
  table.sort(t, function(a, b) return a > b end)
  sorted = true
  for i = 2, n do if t[i - 1] < t[i] then sorted = false end end
  T.ok(sorted, "sort: with an order function (descending)")
  local words = {}
  for i = 1, 70000 do words[i] = ("w%05d"):format((i * 7919) % 70001) end
  table.sort(words)
  sorted = true
  for i = 2, #words do if words[i - 1] >= words[i] then sorted = false end end
  T.ok(sorted and words[1] == "w00001" and words[70000] == "w70000", "sort: 70000 distinct strings")
  local store = {}
  for i = 1, 70000 do store[i] = 70001 - i end
  local proxy = setmetatable({}, {__index = store, __newindex = store, __len = function() return #store end})
  table.sort(proxy)
  T.ok(store[1] == 1 and store[70000] == 70000 and store[35000] == 35000, "sort: through __index, __newindex and __len, as Lua 5.4 does")
  local mixed = {}
  for i = 1, 70000 do mixed[i] = i end
  mixed[40000] = "x"
  local at, e = line(), err_of(function() table.sort(mixed) end)
  T.ok(e and e:find("test_string_limits.lua:" .. at .. ": attempt to compare", 1, true), "sort: values that do not compare (" .. tostring(e) .. ")")
  at, e = line(), err_of(function() table.sort(t, function(a, b) error("from the order function") end) end)
  T.ok(e and e:find("test_string_limits.lua:" .. at .. ": from the order function", 1, true), "sort: an error in the order function (" .. tostring(e) .. ")")
end

T.done()
