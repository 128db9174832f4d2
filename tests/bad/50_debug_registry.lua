-- expect: 50_debug_registry\.lua:3: debug\.getregistry is not available in the sandbox
-- Reaching the registry through the debug library.
local r = debug.getregistry()
