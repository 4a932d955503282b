#!/usr/bin/env bash
# What a user gets from npm, checked the way a user gets it. Packs the linux-x64-gnu
# platform package (with the release addon) and the staged main package into pack/,
# publishes both to a private registry (verdaccio on loopback, storage in a temp folder;
# other packages come through it from the usual registry), then, in empty projects with
# only node, npm and npx on PATH (no cargo, no rustc), installs `ferry-engine` by name and
# uses it: require, import from .mjs and from a "type": "module" project, a strict
# TypeScript consumer (skipLibCheck: false) under node16, nodenext, bundler and node10,
# `npx tebench --local`, the one-shot `npx -p ferry-engine tebench`, and the loader's
# message where the platform package is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
platform=linux-x64-gnu
addon=ferry.$platform.node
floor=${FERRY_GLIBC_FLOOR:-2.17}
name=$(node -p "require('./package.json').name")
version=$(node -p "require('./package.json').version")
timeout_bin=$(command -v timeout)

work=$(mktemp -d /tmp/ferry-pack.XXXXXX)
registry_pid=
cleanup() {
  local rc=$?
  if [ -n "$registry_pid" ] && kill -0 "$registry_pid" 2>/dev/null; then
    kill "$registry_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$registry_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$registry_pid" 2>/dev/null || true
  fi
  [ "$rc" -eq 0 ] || { echo "--- registry log (last lines)"; tail -20 "$work/registry.log" 2>/dev/null || true; } >&2
  rm -f "npm/$platform/$addon"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM # through the EXIT trap: the registry is stopped either way
fail() { echo "test-pack: FAIL: $*" >&2; exit 1; }
step() { echo "test-pack: $*"; }

# The API's modules (lib/*.ts), as they are built: code and declarations.
lib_files=$(for f in lib/*.ts; do m=$(basename "$f" .ts); printf 'dist/lib/%s.d.ts dist/lib/%s.js ' "$m" "$m"; done)
tebench_files=$(for m in command config engine-setup fault flags initiator interrupt local output progress runinfo stripes summary target; do printf 'dist/bench/tebench/%s.js ' "$m"; done)
# shellcheck disable=SC2086 # one word per file
for f in "$addon" dist/index.js dist/binding.d.ts dist/loader.js dist/bench/options.js dist/bench/tebench.js $tebench_files $lib_files; do
  [ -f "$f" ] || fail "$f missing: build first (npm run build:release && npm run build:ts)"
done

# The addon as shipped: no newer glibc than the floor, stripped.
need=$(objdump -T "$addon" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
[ "$(printf '%s\n%s\n' "$need" "$floor" | sort -V | tail -1)" = "$floor" ] ||
  fail "$addon needs glibc $need, newer than the floor $floor: build it with npm run build:release"
if readelf -S "$addon" | grep -q '\.symtab'; then fail "$addon is not stripped: build it with npm run build:release"; fi
step "$addon needs glibc $need (floor $floor), stripped, $(stat -c %s "$addon") bytes"

# Packing. A platform package refuses to pack without its binary.
rm -rf pack && mkdir pack
rm -f "npm/$platform/$addon"
if (cd "npm/$platform" && npm pack --silent --pack-destination "$root/pack" >/dev/null 2>&1); then
  fail "npm/$platform packed without its binary"
fi
cp "$addon" "npm/$platform/"
(cd "npm/$platform" && npm pack --silent --pack-destination "$root/pack" >/dev/null)
rm -f "npm/$platform/$addon"
stage=$(node scripts/stage-package.mjs)
(cd "$stage" && npm pack --silent --pack-destination "$root/pack" >/dev/null)
main_tgz=pack/$name-$version.tgz
platform_tgz=pack/$name-$platform-$version.tgz
[ -f "$main_tgz" ] && [ -f "$platform_tgz" ] || fail "tarballs missing in pack/: $(ls pack)"

# The main tarball holds exactly these files, and a manifest with no scripts and every
# platform package as an optional dependency.
files=$(tar -tzf "$main_tgz" | sed 's|^package/||' | LC_ALL=C sort | tr '\n' ' ')
# shellcheck disable=SC2086 # one word per file
want=$(printf '%s\n' LICENSE README.md binding.cjs dist/bench/options.js dist/bench/tebench.js $tebench_files dist/binding.d.ts dist/index.d.ts dist/index.js dist/loader.js package.json $lib_files | LC_ALL=C sort | tr '\n' ' ')
[ "$files" = "$want" ] || fail "$main_tgz holds: $files; expected: $want"
[ "$(tar -tzf "$platform_tgz" | sort | tr '\n' ' ')" = "package/README.md package/$addon package/package.json " ] ||
  fail "$platform_tgz holds: $(tar -tzf "$platform_tgz" | tr '\n' ' ')"
tar -xzOf "$main_tgz" package/package.json | node -e '
  const m = JSON.parse(require("fs").readFileSync(0, "utf8"))
  const want = m.napi.targets.length
  const problems = []
  if (m.scripts) problems.push("has scripts: " + Object.keys(m.scripts).join(", "))
  if (Object.keys(m.optionalDependencies ?? {}).length !== want) problems.push("optionalDependencies: " + JSON.stringify(m.optionalDependencies))
  for (const [dep, v] of Object.entries(m.optionalDependencies ?? {})) if (v !== m.version) problems.push(dep + "@" + v + " is not " + m.version)
  if (!m.exports?.["."]?.import?.types || !m.exports?.["."]?.require?.types) problems.push("exports without types")
  if (!m.repository || !m.homepage || !m.license) problems.push("repository, homepage or license missing")
  if (problems.length) { console.error(problems.join("\n")); process.exit(1) }
' || fail "published manifest"
step "packed $(cd pack && ls ./*.tgz | tr '\n' ' ')"

# The registry: verdaccio on a free loopback port. ferry-engine* are served from its own
# storage only (never proxied: an unrelated package of that name elsewhere must not be
# installed); everything else comes through it from the usual registry.
port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close() })')
url=http://127.0.0.1:$port
upstream=$(npm config get registry)
cat >"$work/registry.yaml" <<EOF
storage: $work/storage
auth:
  htpasswd:
    file: $work/htpasswd
uplinks:
  upstream:
    url: $upstream
    timeout: 120s
packages:
  '$name':
    access: \$all
    publish: \$authenticated
  '$name-*':
    access: \$all
    publish: \$authenticated
  '**':
    access: \$all
    proxy: upstream
web:
  enable: false
log: { type: stdout, format: pretty, level: warn }
EOF
node_modules/.bin/verdaccio --config "$work/registry.yaml" --listen "127.0.0.1:$port" >"$work/registry.log" 2>&1 &
registry_pid=$!
for i in $(seq 120); do
  kill -0 "$registry_pid" 2>/dev/null || fail "the registry exited"
  if node -e "fetch('$url/-/ping').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"; then break; fi
  [ "$i" -lt 120 ] || fail "the registry did not answer on $url within 60 s"
  sleep 0.5
done
token=$(node -e "
  fetch('$url/-/user/org.couchdb.user:ferry', { method: 'PUT', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'ferry', password: 'pack-check-only' }) })
    .then(async (r) => { const j = await r.json(); if (!j.token) throw new Error(r.status + ' ' + JSON.stringify(j)); console.log(j.token) })
    .catch((e) => { console.error(e); process.exit(1) })") || fail "no registry user"
mkdir -p "$work/home" "$work/bin"
printf 'registry=%s/\n//127.0.0.1:%s/:_authToken=%s\nfund=false\naudit=false\nupdate-notifier=false\n' "$url" "$port" "$token" >"$work/npmrc"
# The user's machine: node, npm, npx and sh (npx runs bins through it) only; its own
# home, npm settings and cache.
for tool in node npm npx sh; do ln -s "$(command -v "$tool")" "$work/bin/$tool"; done
as_user() {
  env -i HOME="$work/home" PATH="$work/bin" NPM_CONFIG_USERCONFIG="$work/npmrc" NPM_CONFIG_CACHE="$work/npm-cache" "$@"
}
as_user node -e 'for (const t of ["cargo", "rustc"]) if (require("child_process").spawnSync(t).error?.code !== "ENOENT") process.exit(1)' ||
  fail "cargo or rustc is reachable from the user's PATH"

for tgz in "$platform_tgz" "$main_tgz"; do
  as_user "$timeout_bin" 300 npm publish --silent "$root/$tgz" >/dev/null || fail "publishing $tgz"
done
step "published to $url"

project() { # project DIR [package.json fields]: an empty project
  mkdir -p "$work/$1"
  echo "{\"name\":\"pack-check-$1\",\"version\":\"1.0.0\",\"private\":true${2:+,$2}}" >"$work/$1/package.json"
}
install() { # install DIR PACKAGE...: npm install by name, in DIR
  (cd "$work/$1" && as_user "$timeout_bin" 600 npm install --no-audit --no-fund --silent "${@:2}") || fail "npm install ${*:2} in $1"
}

# CommonJS and .mjs in one project; the platform package comes as an optional dependency.
project cjs
install cjs "$name"
[ -f "$work/cjs/node_modules/$name-$platform/$addon" ] || fail "npm install $name brought no $name-$platform"
cp scripts/pack-check/roundtrip.cjs scripts/pack-check/roundtrip.mjs "$work/cjs/"
(cd "$work/cjs" && as_user "$timeout_bin" 120 node roundtrip.cjs && as_user "$timeout_bin" 120 node roundtrip.mjs) || fail "require/import in a CommonJS project"

# A "type": "module" project.
project esm '"type":"module"'
install esm "$name"
cp scripts/pack-check/roundtrip.cjs "$work/esm/"
cp scripts/pack-check/roundtrip.mjs "$work/esm/index.js"
(cd "$work/esm" && as_user "$timeout_bin" 120 node index.js) || fail "import in a \"type\": \"module\" project"

# TypeScript, the version this repository builds with.
project ts
install ts "$name" "typescript@$(node -p "require('typescript/package.json').version")" "@types/node@$(node -p "require('@types/node/package.json').version")"
cp scripts/pack-check/consumer.ts scripts/pack-check/tsconfig.*.json "$work/ts/"
cp "$work/ts/consumer.ts" "$work/ts/consumer.cts"
cp "$work/ts/consumer.ts" "$work/ts/consumer.mts"
for resolution in node16 nodenext bundler node10; do
  (cd "$work/ts" && as_user node node_modules/typescript/bin/tsc -p "tsconfig.$resolution.json") ||
    fail "TypeScript consumer, moduleResolution $resolution (strict, skipLibCheck: false)"
done
step "require, import (.mjs, \"type\": \"module\") and TypeScript (node16, nodenext, bundler, node10) OK"

# tebench from the installed package, and the one-shot form without a local install.
(cd "$work/cjs" && as_user "$timeout_bin" 300 npx --no-install tebench --local --duration=1 --max_block_size=1048576) ||
  fail "npx tebench --local"
mkdir "$work/oneshot"
(cd "$work/oneshot" && as_user "$timeout_bin" 300 npx --yes -p "$name" tebench --help >"$work/oneshot.out") ||
  fail "npx -p $name tebench --help"
grep -q -- '--target_seg_name' "$work/oneshot.out" || fail "npx -p $name tebench --help printed: $(head -5 "$work/oneshot.out")"
(cd "$work/oneshot" && as_user "$timeout_bin" 300 npx --yes -p "$name" tebench --version >"$work/version.out") ||
  fail "npx -p $name tebench --version"
grep -q "^tebench ($name) $version, commit " "$work/version.out" || fail "tebench --version printed: $(head -5 "$work/version.out")"

# Without its platform package (optional dependencies left out), the loader names the
# platform and the package to install.
project noopt
install noopt --omit=optional "$name"
if (cd "$work/noopt" && as_user node -e "require('$name')" 2>"$work/noopt.err"); then
  fail "require worked without the platform package"
fi
grep -q "npm install $name-$platform@$version" "$work/noopt.err" ||
  fail "the loader's error does not name $name-$platform: $(head -5 "$work/noopt.err")"
step "tebench (installed and one-shot) and the loader's message OK"

echo "test-pack: OK ($name@$version from a registry by name, tarballs in pack/, no cargo or rustc on PATH)"
