# The sandbox tells a script nothing about what lies outside it: a denial
# says the same whether or not the path exists (io.open, io.lines, os.remove,
# ck.listdir, ck.mkdir, ck.safetensors, and a path that cannot even be
# resolved: a symlink loop), require answers "not found" alike for a module
# outside that exists and one that does not, and no message prints where a
# symlink on the way points (a link into a secret directory, another
# process's /proc/N/cwd): each names the path as the script gave it.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"; [ -n "${bg:-}" ] && kill $bg 2> /dev/null' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
secret=hidden_place_$$
mkdir -p "$t/work" "$t/out" "$t/$secret/dir"
echo secret > "$t/out/there.txt"
mkdir "$t/out/there_dir"
echo 'return 1' > "$t/out/there_mod.lua"
echo x > "$t/$secret/f.txt"
ln -s "$t/$secret" "$t/work/link"
ln -s "$t/out/loop_a" "$t/out/loop_b"
ln -s "$t/out/loop_b" "$t/out/loop_a"
cd "$t/work" || exit 1
O=$t/out
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
# msg CODE: ckrun's one line for CODE, with the names "there"/"missing"/"loop_a" made alike
msg() { "$CK" -e "$1" 2>&1 | sed -e 's/there_mod\|missing_mod/MOD/g' -e 's/there_dir\|missing_dir/DIR/g' -e 's/there\.txt\|missing\.txt\|loop_a/FILE/g'; }

same() { # NAME CODE-WITH-@ (the @ becomes each name in turn)
  local a b c
  a=$(msg "${2//@/$O/there.txt}"); b=$(msg "${2//@/$O/missing.txt}"); c=$(msg "${2//@/$O/loop_a}")
  [ "$a" = "$b" ] && [ "$a" = "$c" ] && echo "$a" | grep -q "is denied"
  ok $? "$1: the same denial for a file that exists, one that does not, a symlink loop ($a)"
}
same "io.open" "io.open('@')"
same "io.open for writing" "io.open('@', 'w')"
same "io.lines" "for l in io.lines('@') do end"
same "os.remove" "os.remove('@')"
same "os.rename" "os.rename('@', 'here')"
same "ck.safetensors" "require('ck').safetensors('@')"
same "ck.write_safetensors" "require('ck').write_safetensors('@', {{'x', {1}, {1}}})"

a=$(msg "require('ck').listdir('$O/there_dir')"); b=$(msg "require('ck').listdir('$O/missing_dir')")
[ "$a" = "$b" ] && echo "$a" | grep -q "is denied"; ok $? "ck.listdir: the same denial for a directory that exists and one that does not ($a)"
a=$(msg "require('ck').mkdir('$O/there_dir/x')"); b=$(msg "require('ck').mkdir('$O/missing_dir/x')")
[ "$a" = "$b" ] && echo "$a" | grep -q "is denied"; ok $? "ck.mkdir: the same ($a)"

a=$(msg "package.path = '$O/?.lua'; require 'there_mod'"); b=$(msg "package.path = '$O/?.lua'; require 'missing_mod'")
[ "$a" = "$b" ] && echo "$a" | grep -q "not found"; ok $? "require: a module outside that exists and one that does not read alike ($a)"
a=$(msg "package.path = '$O/?.lua;$O/?/init.lua'; local ok, e = pcall(require, 'there_mod'); error(e, 0)")
b=$(msg "package.path = '$O/?.lua;$O/?/init.lua'; local ok, e = pcall(require, 'missing_mod'); error(e, 0)")
[ "$a" = "$b" ]; ok $? "and caught with pcall, the messages are equal too"

# where links point is never printed
for code in "io.open('link/f.txt')" "io.open('link/f.txt', 'w')" "require('ck').listdir('link/dir')" \
            "require('ck').listdir('link')" "package.path = './link/?.lua'; require 'f'" "io.open('link/../link/f.txt')"; do
  m=$("$CK" -e "$code" 2>&1)
  ! echo "$m" | grep -q "$secret" && echo "$m" | grep -qE "denied|not found"
  ok $? "a symlink's target stays unnamed: $code -> $m"
done
# another process's working directory
mkdir -p "$t/$secret/cwd"
(cd "$t/$secret/cwd" && exec sleep 30) & bg=$!
# until the link names the hidden directory (else the checks test nothing)
for _ in $(seq 100); do
  case $(readlink "/proc/$bg/cwd" 2> /dev/null) in *"$secret"*) break ;; esac
  sleep 0.05
done
case $(readlink "/proc/$bg/cwd" 2> /dev/null) in
  *"$secret"*) ;; *) echo "FAIL the helper process never entered the hidden directory"; exit 1 ;;
esac
for code in "io.open('/proc/$bg/cwd/x')" "io.open('/proc/$bg/cwd')" "require('ck').listdir('/proc/$bg/cwd')" \
            "require('ck').mkdir('/proc/$bg/cwd/d')"; do
  m=$("$CK" -e "$code" 2>&1)
  ! echo "$m" | grep -q "$secret" && echo "$m" | grep -q "'/proc/$bg/cwd"
  ok $? "another process's cwd stays unnamed, the path is named as given: $m"
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
