-- ck.json_encode and ck.json_decode (jansson): values round-trip exactly,
-- objects have sorted or given key order, and what JSON cannot hold is an
-- error naming the script line and where in the value it is.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

do
  local s = ck.json_encode{b = 1, a = {1, 2.5, "x\"\n"}, c = ck.json_null, d = {}, e = true}
  T.ok(s == '{"a":[1,2.5,"x\\"\\n"],"b":1,"c":null,"d":[],"e":true}',
    "encode: one compact line, object keys sorted, null from ck.json_null, an empty table as [] (" .. s .. ")")
  s = ck.json_encode(ck.json_object{{"z", 1}, {"gone"}, {"a", 2}}, {spaced = true})
  T.ok(s == '{"z": 1, "a": 2}', "encode: ck.json_object keeps its pairs' order and leaves out a pair without a value (" .. s .. ")")
end

do
  local r, bad = T.rng(5), nil
  for i = 1, 2000 do
    local v = (r() - 0.5) * 10 ^ math.floor(r() * 40 - 20)
    local back = ck.json_decode(ck.json_encode{v})[1]
    if back ~= v or math.type(back) ~= "float" then bad = v; break end
  end
  T.ok(bad == nil, "floats read back bitwise equal and still floats, 2000 values over 40 decades (" .. tostring(bad) .. ")")
  local ints = ck.json_decode(ck.json_encode{math.maxinteger, math.mininteger, 0, 1.0})
  T.ok(ints[1] == math.maxinteger and ints[2] == math.mininteger and math.type(ints[3]) == "integer" and
    math.type(ints[4]) == "float", "integers stay integers (64 bits) and 1.0 stays a float")
  T.ok(ck.json_encode{0.003, 2.5, 0.1} == "[0.003,2.5,0.1]",
    "reals are written as short as they read back: 15 digits when every one needs no more")
  T.ok(ck.json_encode{0.1, 1 / 3} == "[0.10000000000000001,0.33333333333333331]",
    "a real that needs 17 digits writes the whole dump at 17")
  T.ok(ck.json_encode({1.0, 2 ^ 40}, {whole_floats = "integer"}) == "[1,1099511627776]",
    "whole_floats = \"integer\" writes whole floats as integers")
end

do
  local v = ck.json_decode('{"in_channels": 4, "block_out_channels": [320, 640], "act": null, "scale": 0.18215, "name": "caf\\u00e9"}')
  T.ok(v.in_channels == 4 and v.block_out_channels[2] == 640 and v.act == ck.json_null and v.scale == 0.18215 and
    v.name == "café", "decode: objects are tables by key, arrays lists, null ck.json_null, \\u escapes UTF-8")
  local ok, err = pcall(ck.json_decode, '{"a": 1,\n "b": }')
  T.ok(not ok and err:match("test_json%.lua:%d+: json_decode: .*line 2"), "decode: malformed text names the script line and the text's line (" .. tostring(err) .. ")")
  ok, err = pcall(ck.json_decode, '{"a": 1, "a": 2}')
  T.ok(not ok and err:match("duplicate"), "decode: a duplicate key is an error")
end

local function fails(v, want, what, opts)
  local ok, err = pcall(ck.json_encode, v, opts)
  T.ok(not ok and err:match("test_json%.lua:%d+: json_encode: ") and err:find(want, 1, true) ~= nil,
    what .. " (" .. tostring(err) .. ")")
end

do
  local t = {name = "x"}
  t.kids = {t}
  fails({root = t}, "root.kids[1] holds itself (a cycle)", "a cycle is an error naming where it closes")
  local shared = {1}
  T.ok(ck.json_encode{shared, shared} == "[[1],[1]]", "a table reached twice without a cycle is written twice")
  fails({loss = 0 / 0}, "loss is not a finite number (nan)", "NaN is an error")
  fails({a = {1, -math.huge}}, "a[2] is not a finite number (-inf)", "an infinity is an error")
  T.ok(ck.json_encode({0 / 0, math.huge}, {nonfinite = "null"}) == "[null,null]", "nonfinite = \"null\" writes them as null")
  fails({f = print}, "f is a function", "a function is an error")
  fails({s = "ok\xff"}, "s is not valid UTF-8 (at byte 3)", "invalid UTF-8 is an error")
  fails({1, nil, 3}, "a list with holes", "a list with holes is an error")
  fails({1, x = 2}, "mixes string keys and list entries", "a mixed table is an error")
  local deep = {}
  local d = deep
  for _ = 1, 150 do d[1] = {}; d = d[1] end
  fails(deep, "nested deeper than 100 tables", "nesting past max_depth (100 by default) is an error")
  T.ok(#ck.json_encode(deep, {max_depth = 200}) == 2 * 151, "max_depth raises the bound")
  -- metamethods are not called: the raw table is written
  local proxy = setmetatable({}, {__index = function() return 1 end, __pairs = function() error("called") end})
  T.ok(ck.json_encode{proxy} == "[[]]", "tables are read raw: __index and __pairs are not called")
end

T.done()
