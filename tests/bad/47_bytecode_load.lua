-- expect: 47_bytecode_load\.lua:4: load: binary chunks are refused in the sandbox
-- Loading precompiled bytecode from a string.
local code = "\27Lua\84\0\25\147\13\10\26\10\4\8\8"
local f = load(code)
