# Installing: `cmake --install` into a temporary prefix puts ckrun, libck
# (static and shared), ck.h, ck.pc, ck.so and the stdlib where pkg-config and
# a stock lua5.4 look; a host built with `pkg-config --cflags --libs ck` (and
# one linked with libck.a) runs tests/c/host_embed.c, the whole embedding API;
# the installed ckrun loads the installed stdlib and CUDA backend.
set -u
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

cmake --install "$CK_BUILD" --prefix "$prefix" > "$prefix/install.log" 2>&1
ok $? "cmake --install --prefix $prefix"
for f in bin/ckrun lib/libck.a lib/libck.so lib/libck.so.0 include/ck.h lib/pkgconfig/ck.pc lib/lua/5.4/ck.so \
         share/lua/5.4/ck/nn.lua share/lua/5.4/ck/unet.lua; do
  [ -e "$prefix/$f" ]; ok $? "installs $f"
done

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[ "$(pkg-config --modversion ck)" = "$("$prefix/bin/ckrun" --version | cut -d' ' -f2)" ]
ok $? "pkg-config knows ck at the version ckrun reports"

cc -O1 -Wall tests/c/host_embed.c $(pkg-config --cflags --libs ck) -pthread -lm -o "$prefix/host" 2> "$prefix/cc.log"
ok $? "a host builds with \`cc host.c \$(pkg-config --cflags --libs ck)\`"
cat "$prefix/cc.log"
ldd "$prefix/host" 2>/dev/null | grep -q "$prefix/lib/libck.so"
ok $? "it runs on the installed libck.so (no LD_LIBRARY_PATH)"
OMP_NUM_THREADS=2 "$prefix/host" > "$prefix/host.log" 2>&1
rc=$?
grep -v '^ok' "$prefix/host.log"
[ $rc = 0 ] && tail -1 "$prefix/host.log" | grep -qE '^[0-9]+ passed, 0 failed$'
ok $? "the host program passes: $(tail -1 "$prefix/host.log")"

static_libs=$(pkg-config --static --libs ck | sed "s#-lck\\b#$prefix/lib/libck.a#")
cc -O1 tests/c/host_embed.c $(pkg-config --cflags ck) $static_libs -pthread -lm -o "$prefix/host_static" 2> "$prefix/cc.log"
ok $? "a host links libck.a with \`pkg-config --static --libs ck\`"
! ldd "$prefix/host_static" 2>/dev/null | grep -q libck.so
ok $? "that host does not load libck.so"

out=$(cd "$prefix" && LUA_CPATH="$prefix/lib/lua/5.4/?.so;;" LUA_PATH="$prefix/share/lua/5.4/?.lua;;" lua5.4 -e '
local ck = require "ck"
local nn = require "ck.nn"
print(ck.version, package.searchpath("ck.nn", package.path))' 2>&1)
[ "$out" = "$(pkg-config --modversion ck)	$prefix/share/lua/5.4/ck/nn.lua" ]
ok $? "a stock lua5.4 loads the installed ck.so and ck.nn ($out)"

out=$(cd "$prefix" && "$prefix/bin/ckrun" -e 'require "ck.unet"; print((package.path:match("^[^;]*")))' 2>&1)
[ "$out" = "$prefix/share/lua/5.4/?.lua" ]
ok $? "the installed ckrun puts the installed stdlib first ($out)"
out=$(cd "$prefix" && "$prefix/bin/ckrun" "$OLDPWD/tests/scripts/train_small.lua" --steps 2 2>&1 | grep -c '^loss')
[ "$out" = 2 ]
ok $? "the installed ckrun trains"
out=$(build_out=$("$CKRUN" -e 'print((package.path:match("^[^;]*")))'); echo "$build_out")
[ "$out" = "$PWD/stdlib/?.lua" ]
ok $? "the build's ckrun keeps the source tree's stdlib ($out)"

# the CUDA backend, where this build has one: installed beside libck, and it
# loads from there (its CUDA libraries resolve); without a driver it finds no device
if [ -e "$CK_BUILD/libck_cuda.so" ]; then
  [ -e "$prefix/lib/libck_cuda.so" ]; ok $? "installs lib/libck_cuda.so"
  out=$(CK_CUDA_MODULE="$prefix/lib/libck_cuda.so" "$prefix/bin/ckrun" --device cuda -e 'print("ran")' 2>&1)
  case "$out" in ran|"ckrun: no CUDA device is present") r=0 ;; *) r=1 ;; esac
  ok $r "the installed ckrun loads the installed libck_cuda.so ($out)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
