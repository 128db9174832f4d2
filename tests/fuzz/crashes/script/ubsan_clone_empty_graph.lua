-- Finding (fuzz_script, also make test-asan: tests/bad 28-31, sandbox):
-- compiling a graph that has tensors but no op nodes. ck_graph_clone
-- (vm/graph/graph.c:35-36) calls memcpy(c->n, g->n, 0) with g->n == NULL, which is
-- undefined behaviour (memcpy's arguments are declared nonnull; UBSan stops
-- there). Harmless in practice, but it stops every sanitized run. Fix: copy
-- only when g->nt / g->nn are non-zero. Reproduce: build-fuzz/fuzz_script THIS_FILE
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 4, 8, 8})
local p = g:compile{outputs = {}}
