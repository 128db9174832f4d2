-- expect: 51_gc_finalizer\.lua:3: setmetatable: __gc metamethods are not available in the sandbox
-- A finalizer that would loop inside the collector, where no limit can stop it.
setmetatable({}, {__gc = function() while true do end end})
