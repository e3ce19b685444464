#!/usr/bin/env bash
# test/softroce/run.sh: run commands against a real verbs device (Soft-RoCE,
# the kernel's rdma_rxe) inside a QEMU guest, on a machine with no RDMA NIC
# and no InfiniBand support in its own kernel. See test/softroce/README.md.
#
#   bash test/softroce/run.sh [options] [--] [COMMAND...]
#
# Stages: packages (Debian, --no-install-recommends, skipped when present),
# kernel (the package linux-image-amd64 depends on, apt-get download'ed and
# unpacked into the cache, never installed), build (the cgo probe), initramfs
# (busybox, kmod, rdma-core/iproute2/verbs tools, their libraries, the tests'
# binaries), boot+tests (qemu-system-x86_64 -accel tcg under timeout).
#
# The guest reports each test as
#   @@SOFTROCE:<token> RESULT <name> PASS|FAIL rc=<n> secs=<s>
# on its console (the token is random per run, so test output cannot forge
# it). A test with no such line (guest hung, killed by timeout, crashed)
# counts as failed. The LAST line printed is exactly `N passed, M failed`;
# the exit status is 0 only if M == 0 and N > 0.
set -euo pipefail
export LC_ALL=C
# depmod, ldconfig and mknod live in sbin, not on a non-root PATH on Debian.
export PATH="$PATH:/usr/sbin:/sbin"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${SOFTROCE_CACHE:-$repo/.cache/softroce}
vm_timeout=${SOFTROCE_TIMEOUT:-240}          # whole guest run (boot, setup, all tests)
test_timeout=${SOFTROCE_TEST_TIMEOUT:-120}   # each test, enforced inside the guest
tail_lines=${SOFTROCE_FAIL_TAIL:-40}         # lines of a failed test's output repeated after the results
mem=${SOFTROCE_MEM:-1024}                    # MiB per guest
smp=${SOFTROCE_SMP:-}                        # default: 2, or 1 per guest with --two-hosts
mtu=${SOFTROCE_MTU:-9000}                    # netdev MTU under rxe0 (>= 4200 gives active_mtu 4096)
accel=${SOFTROCE_ACCEL:-tcg}                 # /dev/kvm here is not usable by stock guests
pvh=${SOFTROCE_PVH:-1}                       # boot the uncompressed ELF kernel (PVH entry)
go_cmd=${GO:-go}

packages=(qemu-system-x86 busybox-static ibverbs-utils ibverbs-providers rdma-core perftest
	rdmacm-utils iproute2 libibverbs-dev cpio kmod gcc libc6-dev xz-utils)
# Modules for the guest; their dependencies are added by modprobe --show-depends.
# siw (soft-iWARP) is not in Debian's kernel: run.sh builds it (stage siw).
modules=(crc32_generic rdma_rxe siw ib_uverbs veth rdma_ucm configfs virtio_pci virtio_net)

two_hosts=0
defaults=1
keep=0
test_names=()
test_cmds=()
bins=()
files=()

usage() {
	cat <<'EOF'
usage: bash test/softroce/run.sh [options] [--] [COMMAND...]

Boots a Debian kernel under QEMU (TCG), creates the Soft-RoCE device rxe0 and
runs each test in the guest, one after the other; prints `N passed, M failed`
last and exits non-zero unless every test passed.

Built-in checks (unless --no-defaults): devinfo (ibv_devinfo -d rxe0, port
active), rc_pingpong (ibv_rc_pingpong server + client, GID index 1),
siw_devinfo (siw0 is iWARP, port active), siw_rping (rping over rdma_cm on
siw0's IP), probe (Go cgo probe: device, port, GID, PD, 1 MiB MR, CQ +
channel, RC QP) and probe_write (the probe plus an RDMA WRITE between two
connected RC QPs).

options:
  --test NAME=CMD   add a test: CMD runs under /bin/sh (busybox) in the guest
  COMMAND...        each further argument is a test named cmd1, cmd2, ...
  --bin FILE        copy an executable (and its ldd libraries) into the guest's
                    PATH, /opt/softroce/bin/; e.g. a `go test -c` binary
  --file SRC[:DST]  copy a file or directory into the guest (default
                    DST /opt/softroce/data/<basename of SRC>)
  --no-defaults     do not run the built-in checks (and do not build the probe)
  --two-hosts       two guests joined by a UDP socket netdev on 127.0.0.1, rxe0
                    on eth0 in each; every test runs in both (SOFTROCE_ROLE is
                    server in one, client in the other) and counts once per guest
  --timeout SECS    bound on each guest's whole run (default 240)
  --test-timeout SECS  bound on each test inside the guest (default 120)
  --keep            keep the work directory (initramfs tree, console logs)
  --install-only    install the Debian packages (gcc, libibverbs-dev, qemu, ...)
                    and exit, e.g. before building cgo test binaries

environment: SOFTROCE_CACHE (default <repo>/.cache/softroce), SOFTROCE_TIMEOUT,
SOFTROCE_TEST_TIMEOUT, SOFTROCE_MEM (MiB, 1024), SOFTROCE_SMP, SOFTROCE_MTU
(9000), SOFTROCE_ACCEL (tcg), SOFTROCE_KERNEL_PKG (default: what
linux-image-amd64 depends on), GO (go).

In the guest each test sees SOFTROCE_DEV=rxe0 SOFTROCE_PORT=1
SOFTROCE_GID_INDEX=1 SOFTROCE_NETDEV SOFTROCE_IP SOFTROCE_PEER_IP
SOFTROCE_ROLE (single|server|client), and for soft-iWARP (siw0, built by
run.sh, on its own netdev and subnet 10.0.1.0/24) SOFTROCE_SIW_DEV=siw0
SOFTROCE_SIW_NETDEV SOFTROCE_SIW_IP SOFTROCE_SIW_PEER_IP; it runs in
/tmp/softroce with stdin /dev/null, and can call the helpers of
test/softroce/lib.sh.
EOF
}

log() { printf 'softroce: %s\n' "$*"; }
warn() { printf 'softroce: warning: %s\n' "$*" >&2; }
die() {
	printf 'softroce: error: %s\n' "$*" >&2
	exit 1
}

add_test() {
	local name=$1 cmd=$2 n
	[[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad test name '$name' (letters, digits, _ . - only)"
	[ -n "$cmd" ] || die "empty command for test '$name'"
	for n in "${test_names[@]}"; do
		[ "$n" != "$name" ] || die "duplicate test name '$name'"
	done
	test_names+=("$name")
	test_cmds+=("$cmd")
}

need_arg() { [ "$2" -ge 2 ] || die "$1 needs an argument"; }

user_names=()
user_cmds=()
ncmd=0
install_only=0
while [ $# -gt 0 ]; do
	case $1 in
	--two-hosts) two_hosts=1 ;;
	--install-only) install_only=1 ;;
	--no-defaults) defaults=0 ;;
	--keep) keep=1 ;;
	--test)
		need_arg "$1" $#
		[[ $2 == *=* ]] || die "--test takes NAME=CMD"
		user_names+=("${2%%=*}")
		user_cmds+=("${2#*=}")
		shift
		;;
	--bin)
		need_arg "$1" $#
		bins+=("$2")
		shift
		;;
	--file)
		need_arg "$1" $#
		files+=("$2")
		shift
		;;
	--timeout)
		need_arg "$1" $#
		vm_timeout=$2
		shift
		;;
	--test-timeout)
		need_arg "$1" $#
		test_timeout=$2
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	--)
		shift
		break
		;;
	-*) die "unknown option $1 (see --help)" ;;
	*) break ;;
	esac
	shift
done
for c in "$@"; do
	ncmd=$((ncmd + 1))
	user_names+=("cmd$ncmd")
	user_cmds+=("$c")
done

[[ $vm_timeout =~ ^[0-9]+$ && $vm_timeout -gt 0 ]] || die "bad --timeout '$vm_timeout'"
[[ $test_timeout =~ ^[0-9]+$ && $test_timeout -gt 0 ]] || die "bad --test-timeout '$test_timeout'"
if [ -z "$smp" ]; then
	if [ "$two_hosts" = 1 ]; then smp=1; else smp=2; fi
fi

if [ "$defaults" = 1 ]; then
	add_test devinfo 'sr_devinfo'
	add_test rc_pingpong 'sr_rc_pingpong 500'
	# shellcheck disable=SC2016 # expands in the guest
	add_test siw_devinfo 'sr_devinfo "$SOFTROCE_SIW_DEV" iWARP'
	add_test siw_rping 'sr_rping 10'
	# Single quotes: these expand in the guest.
	# shellcheck disable=SC2016
	add_test probe 'softroce-probe -dev "$SOFTROCE_DEV" -port "$SOFTROCE_PORT" -gid-index "$SOFTROCE_GID_INDEX"'
	# shellcheck disable=SC2016
	add_test probe_write 'softroce-probe -dev "$SOFTROCE_DEV" -port "$SOFTROCE_PORT" -gid-index "$SOFTROCE_GID_INDEX" -write'
fi
for i in "${!user_names[@]}"; do
	add_test "${user_names[$i]}" "${user_cmds[$i]}"
done
[ "${#test_names[@]}" -gt 0 ] || [ "$install_only" = 1 ] || die "no tests to run (--no-defaults and no --test/COMMAND)"

if [ "$two_hosts" = 1 ]; then
	roles=(server client)
else
	roles=(single)
fi
expected=()
for n in "${test_names[@]}"; do
	for r in "${roles[@]}"; do
		if [ "$r" = single ]; then expected+=("$n"); else expected+=("$n@$r"); fi
	done
done

# ---------------------------------------------------------------- bookkeeping

finished=0
stage=setup
stage_t0=
stage_times=()
t_start=$EPOCHREALTIME
work=
qemu_pidfiles=()

secs_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
stage_begin() {
	stage=$1
	stage_t0=$EPOCHREALTIME
	log "== $stage"
}
stage_end() {
	local d
	d=$(secs_since "$stage_t0")
	stage_times+=("$stage ${d}s${1:+ ($1)}")
	log "== $stage: ${d}s${1:+ ($1)}"
}

kill_guests() {
	local f pid
	for f in "${qemu_pidfiles[@]}"; do
		[ -s "$f" ] || continue
		pid=$(cat "$f" 2>/dev/null || true)
		if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
}

on_exit() {
	local rc=$?
	trap - EXIT
	kill_guests
	if [ -n "$work" ] && [ -d "$work" ]; then
		if [ "$keep" = 1 ]; then
			log "work directory kept: $work"
		else
			rm -rf "$work"
		fi
	fi
	if [ "$finished" = 0 ]; then
		printf 'softroce: aborted in stage %s (exit %s)\n' "$stage" "$rc" >&2
		echo "0 passed, ${#expected[@]} failed"
		exit 1
	fi
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

as_root() {
	if [ "$(id -u)" = 0 ]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		die "need root (or sudo) for: $*"
	fi
}

apt_updated=0
apt_update() {
	[ "$apt_updated" = 0 ] || return 0
	apt_updated=1
	log "apt-get update"
	as_root timeout 300 apt-get update -q || warn "apt-get update failed"
}

mkdir -p "$cache"
# Serialise the cache-filling stages between concurrent runs on one machine.
exec 9>"$cache/.lock"
if ! flock -w 900 9; then die "could not lock $cache/.lock"; fi

# ------------------------------------------------------------------ packages

stage_begin packages
missing=()
for p in "${packages[@]}"; do
	# dpkg-query exits 0 for a known but not installed package: check the status.
	st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	log "installing: ${missing[*]}"
	# A fresh container has no package lists at all.
	if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then apt_update; fi
	apt_install() {
		as_root env DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q \
			--no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}"
	}
	if ! apt_install; then
		apt_update
		apt_install || die "apt-get install failed"
	fi
	stage_end "installed ${#missing[@]}"
else
	stage_end "all present"
fi
if [ "$install_only" = 1 ]; then
	finished=1
	exit 0
fi

# -------------------------------------------------------------------- kernel

stage_begin kernel
resolve_kernel_pkg() {
	apt-cache depends linux-image-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
kpkg=${SOFTROCE_KERNEL_PKG:-}
if [ -z "$kpkg" ]; then
	kpkg=$(resolve_kernel_pkg || true)
	if [ -z "$kpkg" ]; then
		apt_update
		kpkg=$(resolve_kernel_pkg || true)
	fi
	if [ -z "$kpkg" ]; then
		# No apt lists at all: fall back on a kernel unpacked earlier, if any.
		for d in "$cache"/kernel/linux-image-*/; do
			[ -e "$d/.ok" ] && kpkg=$(basename "$d")
		done
	fi
	[ -n "$kpkg" ] || die "cannot tell which package linux-image-amd64 depends on"
fi
kroot=$cache/kernel/$kpkg
kernel_note="cached $kpkg"
if [ ! -e "$kroot/.ok" ]; then
	mkdir -p "$cache/kernel"
	find_deb() {
		local f
		for f in "$cache/kernel/${kpkg}_"*.deb; do
			[ -f "$f" ] && printf '%s\n' "$f" && return 0
		done
		return 1
	}
	fetch() { (cd "$cache/kernel" && timeout 300 apt-get download -q -o APT::Sandbox::User=root "$kpkg"); }
	if ! deb=$(find_deb); then
		log "apt-get download $kpkg"
		if ! fetch; then
			apt_update
			fetch || die "apt-get download $kpkg failed"
		fi
		deb=$(find_deb) || die "downloaded $kpkg but found no .deb"
	fi
	log "unpacking $(basename "$deb")"
	tmp=$(mktemp -d "$cache/kernel/.unpack.XXXXXX")
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp"
	# Debian 12 ships lib/modules, later releases usr/lib/modules.
	if [ ! -d "$tmp/lib/modules" ] && [ -d "$tmp/usr/lib/modules" ]; then
		mkdir -p "$tmp/lib"
		mv "$tmp/usr/lib/modules" "$tmp/lib/modules"
	fi
	kvers=("$tmp"/lib/modules/*)
	if [ "${#kvers[@]}" != 1 ] || [ ! -d "${kvers[0]}" ]; then
		die "expected one lib/modules/<version> in $deb"
	fi
	kver=$(basename "${kvers[0]}")
	[ -f "$tmp/boot/vmlinuz-$kver" ] || die "no boot/vmlinuz-$kver in $deb"
	# The package carries no modules.dep; build it for the unpacked tree.
	depmod -b "$tmp" "$kver"
	echo "$kver" >"$tmp/.kver"
	touch "$tmp/.ok"
	rm -rf "$kroot"
	mv -T "$tmp" "$kroot"
	rm -f "$deb"
	# Kernels superseded by this one (about 400 MB each unpacked).
	for d in "$cache"/kernel/linux-image-*/; do
		[ "${d%/}" = "$kroot" ] || rm -rf "${d%/}"
	done
	kernel_note="downloaded $kpkg"
fi
kver=$(cat "$kroot/.kver")
kernel=$kroot/boot/vmlinuz-$kver
# Under TCG the bzImage spends seconds in SeaBIOS's load and in decompressing
# itself. QEMU boots the uncompressed ELF vmlinux directly through its PVH
# entry (CONFIG_PVH): unpack it once from the bzImage's XZ payload.
if [ "$pvh" = 1 ] && [ ! -e "$kroot/vmlinux" ] && [ ! -e "$kroot/.no-pvh" ]; then
	off=
	if grep -qx 'CONFIG_PVH=y' "$kroot/boot/config-$kver" 2>/dev/null; then
		off=$(grep -aboP -m1 '\xFD7zXZ\x00' "$kernel" | head -n 1 | cut -d: -f1 || true)
	fi
	if [ -n "$off" ]; then
		# xz stops with an error at the data after the stream: check the result instead.
		tail -c +"$((off + 1))" "$kernel" | xz -dc >"$kroot/vmlinux.tmp" 2>/dev/null || true
	fi
	if [ -n "$off" ] && [ "$(head -c 4 "$kroot/vmlinux.tmp" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
		mv "$kroot/vmlinux.tmp" "$kroot/vmlinux"
	else
		rm -f "$kroot/vmlinux.tmp"
		touch "$kroot/.no-pvh"
		warn "no PVH-bootable vmlinux in $kpkg; booting the bzImage (slower)"
	fi
fi
if [ "$pvh" = 1 ] && [ -e "$kroot/vmlinux" ]; then
	kernel=$kroot/vmlinux
	kernel_note="$kernel_note, PVH vmlinux"
fi
stage_end "$kernel_note; $kver"

# ----------------------------------------------------------------------- siw

# Debian builds its kernels without soft-iWARP (# CONFIG_RDMA_SIW is not
# set), so build siw.ko out of tree from Debian's source of the same
# kernel, against its headers (whose Module.symvers makes the symbol
# versions match), and cache it in the unpacked kernel's module tree, where
# modprobe --show-depends finds it like any other module. Only the siw
# directory is taken from the 140 MB source package, which is not
# installed.
stage_begin siw
siw_ko=$kroot/lib/modules/$kver/extra/siw.ko
siw_note="cached"
if [ ! -e "$siw_ko" ]; then
	hdr=linux-headers-$kver
	src=linux-source-$(echo "$kver" | cut -d. -f1-2)
	if [ "$(dpkg-query -W -f='${Status}' "$hdr" 2>/dev/null || true)" != "install ok installed" ]; then
		log "installing $hdr"
		as_root env DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q \
			--no-install-recommends -o DPkg::Lock::Timeout=300 "$hdr" >/dev/null ||
			{ apt_update && as_root env DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q \
				--no-install-recommends -o DPkg::Lock::Timeout=300 "$hdr" >/dev/null; } ||
			die "apt-get install $hdr failed"
	fi
	tmp=$(mktemp -d "$cache/kernel/.siw.XXXXXX")
	log "apt-get download $src, extracting drivers/infiniband/sw/siw"
	(cd "$tmp" && timeout 300 apt-get download -q -o APT::Sandbox::User=root "$src" >/dev/null) ||
		{ apt_update && (cd "$tmp" && timeout 300 apt-get download -q -o APT::Sandbox::User=root "$src" >/dev/null); } ||
		die "apt-get download $src failed"
	dpkg-deb --fsys-tarfile "$tmp"/"$src"_*.deb | tar -xO "./usr/src/$src.tar.xz" |
		tar -xJ -C "$tmp" "$src/drivers/infiniband/sw/siw" || die "no drivers/infiniband/sw/siw in $src"
	rm -f "$tmp"/*.deb
	make -s -C "/usr/src/$hdr" M="$tmp/$src/drivers/infiniband/sw/siw" CONFIG_RDMA_SIW=m modules >"$tmp/build.log" 2>&1 ||
		{ cat "$tmp/build.log"; die "building siw.ko failed"; }
	built=$tmp/$src/drivers/infiniband/sw/siw/siw.ko
	strip --strip-debug "$built"
	vm=$(modinfo -F vermagic "$built")
	[[ $vm == "$kver "* ]] || die "siw.ko has vermagic '$vm', the guest kernel is $kver"
	mkdir -p "$(dirname "$siw_ko")"
	mv "$built" "$siw_ko.tmp" && mv "$siw_ko.tmp" "$siw_ko"
	depmod -b "$kroot" "$kver"
	rm -rf "$tmp"
	siw_note="built from $src for $kver"
fi
stage_end "$siw_note, $(($(stat -c %s "$siw_ko") / 1024)) KiB"
flock -u 9
exec 9>&-

# --------------------------------------------------------------------- build

stage_begin build
if [ "$defaults" = 1 ]; then
	command -v "$go_cmd" >/dev/null || die "the probe needs Go ($go_cmd not found); or pass --no-defaults"
	mkdir -p "$cache/bin"
	# The softroce build tag keeps the probe (cgo, libibverbs) out of ./... for
	# go vet / go test on machines without libibverbs-dev.
	(cd "$repo" && CGO_ENABLED=1 timeout 600 "$go_cmd" build -tags softroce -trimpath \
		-o "$cache/bin/softroce-probe" ./test/softroce/probe)
	bins=("$cache/bin/softroce-probe" "${bins[@]}")
	stage_end "softroce-probe"
else
	stage_end "skipped (--no-defaults)"
fi

# ----------------------------------------------------------------- initramfs

stage_begin initramfs
mkdir -p "$cache/runs"
# Work directories of runs killed outright (a day old); --keep ones included.
find "$cache/runs" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
work=$(mktemp -d "$cache/runs/run.XXXXXX")
root=$work/root
mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc/softroce/tests,opt/softroce/bin,opt/softroce/data}
mkdir -p "$root"/{proc,sys,dev,tmp,run,root,mnt}
ln -s usr/bin "$root/bin"
ln -s usr/sbin "$root/sbin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
# The kernel gives /init the initramfs's /dev/console; /init reopens it on devtmpfs too.
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || warn "mknod /dev/console failed (not root?)"

declare -A have_lib=()
copy_libs() {
	local lib
	while read -r lib; do
		if [ -z "$lib" ] || [ -n "${have_lib[$lib]:-}" ]; then continue; fi
		have_lib[$lib]=1
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done < <(ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3; next } $1 ~ /^\// { print $1 }')
}
# copy_bin SRC DSTDIR: the executable (symlinks resolved) and its libraries.
copy_bin() {
	local src=$1 dst=$2/${3:-$(basename "$1")}
	[ -f "$src" ] || die "no such file: $src"
	cp -L "$src" "$root$dst"
	chmod 755 "$root$dst"
	copy_libs "$src"
}
find_exe() {
	local d
	for d in /usr/sbin /usr/bin /sbin /bin; do
		[ -x "$d/$1" ] && [ -f "$d/$1" ] && printf '%s\n' "$d/$1" && return 0
	done
	die "$1 not found on this machine"
}
pkg_exes() {
	dpkg -L "$1" | grep -E '^(/usr)?/s?bin/[^/]+$' | while read -r f; do
		[ -f "$f" ] && [ -x "$f" ] && printf '%s\n' "$f"
	done
}

# Verbs, rdma-cm and perftest tools; iproute2's ip and rdma (busybox's own ip
# cannot make veth pairs, so /init calls /usr/bin/ip by path); kmod.
for p in ibverbs-utils rdmacm-utils perftest rdma-core; do
	while read -r f; do
		copy_bin "$f" /usr/bin
	done < <(pkg_exes "$p")
done
for b in ip rdma ss; do copy_bin "$(find_exe "$b")" /usr/bin; done
copy_bin "$(find_exe kmod)" /usr/bin
for b in modprobe insmod rmmod lsmod depmod modinfo; do ln -sf ../bin/kmod "$root/usr/sbin/$b"; done

# libibverbs loads the rxe and siw providers by their .driver files; rsock
# dlopens librdmacm (no binary links it but the rdmacm tools); glibc
# dlopens libgcc_s.
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
mkdir -p "$root/etc/libibverbs.d"
for drv in rxe siw; do
	so=
	for f in /usr/lib/"$multiarch"/libibverbs/lib"$drv"-rdmav*.so; do [ -f "$f" ] && so=$f; done
	[ -n "$so" ] || die "$drv provider (lib$drv-rdmav*.so) not found: is ibverbs-providers installed?"
	mkdir -p "$root$(dirname "$so")"
	cp -L "$so" "$root$so"
	copy_libs "$so"
	cp "/etc/libibverbs.d/$drv.driver" "$root/etc/libibverbs.d/"
done
rdmacm=/usr/lib/$multiarch/librdmacm.so.1
[ -f "$rdmacm" ] || die "$rdmacm not found: is librdmacm1 installed?"
mkdir -p "$root$(dirname "$rdmacm")"
cp -L "$rdmacm" "$root$rdmacm"
copy_libs "$rdmacm"
for f in /lib/"$multiarch"/libgcc_s.so.1 /usr/lib/"$multiarch"/libgcc_s.so.1; do
	if [ -f "$f" ]; then
		mkdir -p "$root$(dirname "$f")"
		cp -L "$f" "$root$f"
		break
	fi
done

# The tests' binaries.
for b in "${bins[@]}"; do copy_bin "$b" /opt/softroce/bin; done
for spec in "${files[@]}"; do
	src=${spec%%:*}
	dst=/opt/softroce/data/$(basename "$src")
	[[ $spec == *:* ]] && dst=${spec#*:}
	[ -e "$src" ] || die "--file: no such file: $src"
	case $dst in
	/*) ;;
	*) die "--file: destination must be absolute: $dst" ;;
	esac
	case $dst/ in
	/tmp/* | /run/* | /dev/* | /proc/* | /sys/*) die "--file: $dst would be hidden by a mount in the guest" ;;
	esac
	mkdir -p "$root$(dirname "$dst")"
	cp -rL "$src" "$root$dst"
done

# Busybox last: an applet link never replaces a real binary copied above.
cp /bin/busybox "$root/usr/bin/busybox"
while read -r a; do
	[ -e "$root/$a" ] || [ -L "$root/$a" ] || ln -s /usr/bin/busybox "$root/$a"
done < <("$root/usr/bin/busybox" --list-full)

# Kernel modules: the list above and everything they depend on.
mods=$(for m in "${modules[@]}"; do
	modprobe -d "$kroot" -S "$kver" --show-depends "$m" || die "module $m not found in $kpkg"
done | awk '$1 == "insmod" { print $2 }' | sort -u)
kmods=$root/lib/modules/$kver
mkdir -p "$kmods"
while read -r m; do
	rel=${m#"$kroot"/lib/modules/"$kver"/}
	mkdir -p "$kmods/$(dirname "$rel")"
	cp "$m" "$kmods/$rel"
done <<<"$mods"
for f in modules.order modules.builtin modules.builtin.modinfo; do
	[ -f "$kroot/lib/modules/$kver/$f" ] && cp "$kroot/lib/modules/$kver/$f" "$kmods/"
done
depmod -b "$root" "$kver"

# /etc, the dynamic loader's cache, the guest scripts and the tests.
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf '127.0.0.1 localhost\n10.0.0.1 softroce-server\n10.0.0.2 softroce-client\n' >"$root/etc/hosts"
printf '/usr/lib/%s\n/usr/local/lib\n' "$multiarch" >"$root/etc/ld.so.conf"
ldconfig -r "$root" 2>/dev/null || warn "ldconfig -r failed; relying on the loader's default paths"
install -m 755 "$here/init.sh" "$root/init"
install -m 644 "$here/lib.sh" "$root/etc/softroce/lib.sh"
token=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
{
	printf 'SR_TOKEN=%s\n' "$token"
	printf 'SR_TEST_TIMEOUT=%s\n' "$test_timeout"
	printf 'SR_MTU=%s\n' "$mtu"
} >"$root/etc/softroce/config"
for i in "${!test_names[@]}"; do
	n=$(printf '%03d' "$i")
	printf '%s\n' "${test_names[$i]}" >"$root/etc/softroce/tests/$n.name"
	printf '%s\n' "${test_cmds[$i]}" >"$root/etc/softroce/tests/$n.cmd"
done

initrd=$work/initrd.img
(cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) | gzip -1 >"$initrd"
stage_end "$(du -m "$initrd" | cut -f1) MB gzipped"

# ---------------------------------------------------------------- boot+tests

stage_begin boot+tests
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found"
qemu_base=(qemu-system-x86_64 -accel "$accel" -cpu max -smp "$smp" -m "$mem"
	-nodefaults -no-user-config -display none -serial stdio -no-reboot
	-kernel "$kernel" -initrd "$initrd")
append="console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init"

# run_guest ROLE [QEMU ARGS...]: console on stdout, raw copy in $work/console-ROLE.log.
run_guest() {
	local role=$1
	shift
	timeout -k 10 "$vm_timeout" "${qemu_base[@]}" -pidfile "$work/qemu-$role.pid" \
		-append "$append softroce.role=$role" "$@" </dev/null 2>&1 |
		tee "$work/console-$role.log"
}

# Guests run in the background and the script waits with the wait builtin:
# a trapped INT/TERM interrupts wait (not a foreground pipeline), and on_exit
# kills the guests by their pid files (timeout puts qemu in its own process
# group, out of reach of the terminal's ^C).
declare -A guest_rc=() gpid=()
if [ "$two_hosts" = 0 ]; then
	log "booting one guest (timeout ${vm_timeout}s, test timeout ${test_timeout}s)"
	qemu_pidfiles+=("$work/qemu-single.pid")
	run_guest single -nic none &
	gpid[single]=$!
else
	# Two pairs of UDP ports on 127.0.0.1 not in use now (p1,p2 for eth0, p1+2,p2+2 for
	# eth1); each guest sends to the other's.
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		p1=$((20000 + RANDOM % 40000))
		p2=$((p1 + 1))
		if ! ss -Hlun "( sport = :$p1 or sport = :$p2 or sport = :$((p1 + 2)) or sport = :$((p2 + 2)) )" 2>/dev/null | grep -q .; then break; fi
	done
	log "booting two guests, UDP 127.0.0.1:$p1 <-> 127.0.0.1:$p2 (timeout ${vm_timeout}s, test timeout ${test_timeout}s)"
	i=0
	for r in server client; do
		i=$((i + 1))
		if [ "$r" = server ]; then mine=$p1 theirs=$p2; else mine=$p2 theirs=$p1; fi
		qemu_pidfiles+=("$work/qemu-$r.pid")
		# eth0 carries rxe0, eth1 siw0: rdma_cm must resolve each IP to its own device.
		run_guest "$r" -netdev "socket,id=n0,udp=127.0.0.1:$theirs,localaddr=127.0.0.1:$mine" \
			-device "virtio-net-pci,netdev=n0,mac=52:54:00:5e:00:0$i,romfile=" \
			-netdev "socket,id=n1,udp=127.0.0.1:$((theirs + 2)),localaddr=127.0.0.1:$((mine + 2))" \
			-device "virtio-net-pci,netdev=n1,mac=52:54:00:5e:01:0$i,romfile=" |
			sed -u "s/^/[$r] /" &
		gpid[$r]=$!
	done
fi
for r in "${roles[@]}"; do
	rc=0
	wait "${gpid[$r]}" || rc=$?
	guest_rc[$r]=$rc
done
stage_end

# -------------------------------------------------------------------- results

passed=0
failed=0
lines=()
failed_tails=() # pairs: a failed test's label, its guest's console log
for r in "${roles[@]}"; do
	logf=$work/console-$r.log
	mark="@@SOFTROCE:$token"
	results=$(tr -d '\r' <"$logf" 2>/dev/null |
		grep -aoE "$mark RESULT [A-Za-z0-9_.-]+ (PASS|FAIL) rc=[0-9]+ secs=[0-9.]+" || true)
	done_seen=0
	grep -aq "$mark DONE" "$logf" 2>/dev/null && done_seen=1
	why="no result: guest did not get to it"
	if [ "${guest_rc[$r]}" = 124 ] || [ "${guest_rc[$r]}" = 137 ]; then
		why="no result: guest killed after ${vm_timeout}s (timeout)"
	elif [ "$done_seen" = 0 ]; then
		why="no result: guest stopped early (exit ${guest_rc[$r]}), see the console above"
	fi
	for n in "${test_names[@]}"; do
		label=$n
		[ "$r" = single ] || label="$n@$r"
		res=$(awk -v n="$n" '$3 == n { print $4, $5, $6; exit }' <<<"$results")
		if [[ $res == PASS* ]]; then
			passed=$((passed + 1))
			lines+=("PASS  $label (${res##*secs=}s)")
		elif [ -n "$res" ]; then
			failed=$((failed + 1))
			lines+=("FAIL  $label (${res#FAIL })")
			failed_tails+=("$label" "$logf")
		else
			failed=$((failed + 1))
			lines+=("FAIL  $label ($why)")
			failed_tails+=("$label" "$logf")
		fi
	done
	mkdir -p "$cache/logs"
	cp "$logf" "$cache/logs/last-console-$r.log" 2>/dev/null || true
done

# The last lines of each failed test's output, between markers that
# suite.sh repeats at its end: the console above may be long gone from a
# CI log's tail.
for ((i = 0; i < ${#failed_tails[@]}; i += 2)); do
	label=${failed_tails[i]}
	echo "softroce: --- the last $tail_lines lines of ${label}'s output:"
	tr -d '\r' <"${failed_tails[i + 1]}" | grep -aF "[${label%@*}] " | tail -n "$tail_lines"
	echo "softroce: --- end of ${label}"
done
echo
log "results ($kver, qemu $accel, $(qemu-system-x86_64 --version | awk 'NR == 1 { print $4 }')):"
for l in "${lines[@]}"; do printf '  %s\n' "$l"; done
log "console logs: $cache/logs/last-console-*.log"
log "stage times:"
for l in "${stage_times[@]}"; do printf '  %s\n' "$l"; done
printf '  total %ss\n' "$(secs_since "$t_start")"
finished=1
kill_guests
if [ "$keep" = 1 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
work=
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
