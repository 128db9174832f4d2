-- ck.array, the host float32 array: shape, length, 1-based flat get/set,
-- reshape and slice as copies, bad shapes and indices refused naming the
-- script line, its bytes checked against the memory limit; p:set takes an
-- array (whole tensor or one batch entry) and p:array copies a tensor out.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local function fails(f, want, what)
  local ok, err = pcall(f)
  T.ok(not ok and tostring(err):match("test_array%.lua:%d+: ") and tostring(err):find(want, 1, true) ~= nil,
    what .. " (" .. tostring(err) .. ")")
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

do
  local a = ck.array({2, 3, 4})
  T.ok(#a == 24 and same(a.shape, {2, 3, 4}), "#a is numel, a.shape the dims")
  local zeros = true
  for i = 1, #a do zeros = zeros and a:get(i) == 0 end
  T.ok(zeros, "a new array is zeros")
  local s = a.shape
  s[1] = 99
  T.ok(a.shape[1] == 2, "a.shape is a copy: changing it changes nothing")
  a:set(7, 2.5)
  T.ok(a:get(7) == 2.5 and a:table()[7] == 2.5 and a:get(8) == 0, "a:set and a:get use the 1-based flat index")
  a:set(1, 0.1)
  T.ok(a:get(1) == string.unpack("<f", string.pack("<f", 0.1)), "values are stored as float32")
  local f = ck.array({3}, -1.5)
  T.ok(same(f:table(), {-1.5, -1.5, -1.5}), "a fill number sets every value")
  local v = ck.array({2, 2}, {{1, 2}, {3, 4}})
  T.ok(same(v:table(), {1, 2, 3, 4}), "nested lists are read row-major")
  T.ok(same(ck.array({4}, {5, 6, 7, 8}):table(), {5, 6, 7, 8}), "a flat list of values")
  local sc = ck.array({})
  T.ok(#sc == 1 and #sc.shape == 0, "a 0-dim array holds one value")
  T.ok(#ck.array({0, 5}) == 0, "a dim of 0 makes an empty array")
  T.ok(#ck.array({1, 1, 1, 1, 1, 1, 1, 2}) == 2, "8 dims")
  T.ok(tostring(a) == "ck.array [2, 3, 4]", "tostring names the shape (" .. tostring(a) .. ")")
end

do
  local a = ck.array({2, 3, 4})
  for i = 1, 24 do a:set(i, i) end
  local r = a:reshape({4, 6})
  T.ok(same(r.shape, {4, 6}) and same(r:table(), a:table()), "reshape keeps the values in order")
  r:set(1, -1)
  T.ok(a:get(1) == 1, "reshape returns a copy")
  T.ok(same(a:reshape({-1, 8}).shape, {3, 8}), "reshape infers one -1 dim")
  -- slice along each dim against indices computed here
  for dim = 1, 3 do
    local start, count = 2, dim == 1 and 1 or 2
    local b = a:slice(dim, start, count)
    local dims = {2, 3, 4}
    local want = {}
    for i = 0, 1 do
      for j = 0, 2 do
        for k = 0, 3 do
          local idx = ({i, j, k})[dim]
          if idx >= start - 1 and idx < start - 1 + count then want[#want + 1] = 1 + (i * 3 + j) * 4 + k end
        end
      end
    end
    dims[dim] = count
    T.ok(same(b.shape, dims) and same(b:table(), want), "slice along dim " .. dim .. " takes those entries, in order")
  end
  T.ok(#a:slice(2, 3, 0) == 0, "a slice of 0 entries is empty")
  fails(function() a:slice(2, 3, 2) end, "slice: entries 3..4 of dim 2, which has 3", "a slice past the end is refused")
  fails(function() a:slice(4, 1, 1) end, "slice: dim 4 of an array of 3 dims", "a slice of a dim that is not there")
  fails(function() a:reshape({5, 5}) end, "reshape: 24 values cannot take a shape of 25 elements",
    "reshape to another element count is refused")
  fails(function() a:get(25) end, "index 25 is outside 1..24", "get past the end is refused")
  fails(function() a:set(0, 1) end, "index 0 is outside 1..24", "set at 0 is refused")
end

fails(function() ck.array({2, -1}) end, "dim 2 is negative", "a negative dim is refused")
fails(function() ck.array({1, 1, 1, 1, 1, 1, 1, 1, 1}) end, "a shape of 9 dims (at most 8)", "9 dims are refused")
fails(function() ck.array({2, 2}, {1, 2, 3}) end, "3 values for 4 elements", "too few values are refused")
fails(function() ck.array({2}, {1, "x"}) end, "value 2 is a string, not a number", "a value that is no number")
fails(function() ck.array({1.5}) end, "shape entry 1 is not an integer", "a dim that is not an integer")
fails(function() ck.array({1000000, 1000000}) end, "would pass the memory limit",
  "an array larger than the memory limit is refused before it is allocated")

do
  -- a shape table whose metamethods must not run: read raw
  local hostile = setmetatable({2, 3}, {__index = function() error("ran __index") end,
                                        __len = function() error("ran __len") end})
  T.ok(#ck.array(hostile) == 6, "shape tables are read raw (no __len or __index)")
end

-- arrays in and out of a program
do
  local g = ck.graph()
  local x = g:input("x", {2, 3})
  local y = x * x
  local p = g:compile{outputs = {y}}
  local a = ck.array({2, 3}, {1, 2, 3, 4, 5, 6})
  p:set("x", a)
  T.ok(same(p:get("x"), {1, 2, 3, 4, 5, 6}), "p:set takes an array of the tensor's element count")
  local back = p:array("x")
  T.ok(same(back.shape, {2, 3}) and same(back:table(), a:table()), "p:array copies an input out with its shape")
  p:set("x", ck.array({3}, {-1, -2, -3}), 2)
  T.ok(same(p:get("x"), {1, 2, 3, -1, -2, -3}), "p:set(name, array, index) sets one batch entry")
  p:forward()
  local out = p:array(y)
  T.ok(same(out.shape, {2, 3}) and same(out:table(), {1, 4, 9, 1, 4, 9}), "p:array copies a kept output")
  back:set(1, 100)
  T.ok(p:get("x")[1] == 1, "the copy is the script's: changing it leaves the program as it was")
  fails(function() p:set("x", ck.array({5})) end, "has 6 elements, got an array of 5",
    "an array of another element count is refused")
  fails(function() p:set("x", ck.array({2}), 1) end, "entry has 3 elements, got an array of 2",
    "an array of another count than a batch entry is refused")
  p:set("x", ck.array({1, 6}, 0.5))
  T.ok(same(p:get("x"), {0.5, 0.5, 0.5, 0.5, 0.5, 0.5}), "only the element count matters to p:set")
  fails(function() p:array("nope") end, "nope", "p:array of an unknown name is refused")
end

T.done()
