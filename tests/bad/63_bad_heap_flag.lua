-- flags: --max-heap lots
-- expect: ^ckrun: --max-heap wants a size such as 512MiB or 'none', got 'lots'$
-- A command-line flag with a malformed value (no script line to name).
print("never runs")
