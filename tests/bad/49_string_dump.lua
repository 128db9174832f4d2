-- expect: 49_string_dump\.lua:3: string\.dump is not available in the sandbox
-- Dumping a function to bytecode.
local b = string.dump(function() end)
