-- expect: 48_bytecode_require\.lua:4: require 'binmod' \('\./binmod\.lua'\): binary chunks are refused
-- Requiring a module file that holds bytecode.
package.path = "./?.lua"
local m = require "binmod"
