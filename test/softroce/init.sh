#!/bin/sh
# shellcheck shell=dash
# /init of the Soft-RoCE guest (busybox sh), put there by test/softroce/run.sh.
#
# Mounts the pseudo file systems, loads the modules (crc32_generic first:
# without it `rdma link add` fails with "No such file or directory"), makes
# the netdevs (two veth pairs, or eth0 and eth1 with --two-hosts), creates
# rxe0 on the first and siw0 (soft-iWARP) on the second,
# then runs /etc/softroce/tests/NNN.cmd one by one, each in its own session
# under a watchdog, its output labelled "[name] ", and reports each as
#   @@SOFTROCE:<token> RESULT <name> PASS|FAIL rc=<n> secs=<s>
# then prints "@@SOFTROCE:<token> DONE ..." and powers off.

export PATH=/opt/softroce/bin:/usr/bin:/usr/sbin:/bin:/sbin
export HOME=/root TMPDIR=/tmp LC_ALL=C

/usr/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
[ -c /dev/console ] && exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm

# shellcheck source=/dev/null
. /etc/softroce/config
MARK="@@SOFTROCE:$SR_TOKEN"
role=single
read -r cmdline </proc/cmdline
for w in $cmdline; do
	case $w in softroce.role=*) role=${w#softroce.role=} ;; esac
done

say() { echo "softroce-guest: $*"; }

# Centiseconds since boot.
now_cs() {
	read -r up _ </proc/uptime
	cs=${up#*.}
	# No leading zero: ash's arithmetic would read "08" as octal.
	echo $((${up%%.*} * 100 + ${cs#0}))
}
fmt_secs() { echo "$(($1 / 100)).$(($1 % 100 / 10))"; }

t_boot=$(now_cs)
say "up after $(fmt_secs "$t_boot")s, kernel $(uname -r), role $role"

poweroff_now() {
	sync
	sleep 0.5
	poweroff -f
	sleep 5
	echo o >/proc/sysrq-trigger
	exit 0
}

setup_ok=1
step() {
	say "+ $*"
	"$@" || {
		say "setup step failed (exit $?): $*"
		setup_ok=0
		return 1
	}
}

# wait_for SECS CMD...: run CMD every 0.1 s until it succeeds, at most SECS.
wait_for() {
	n=$(($1 * 10))
	shift
	while ! "$@"; do
		n=$((n - 1))
		[ "$n" -gt 0 ] || return 1
		sleep 0.1
	done
}
# shellcheck disable=SC2317 # called through wait_for
port_active() { grep -q ACTIVE "/sys/class/infiniband/${1:-rxe0}/ports/1/state" 2>/dev/null; }
# shellcheck disable=SC2317 # called through wait_for
gid1_set() {
	g=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null) || return 1
	[ -n "$g" ] && [ "$g" != 0000:0000:0000:0000:0000:0000:0000:0000 ]
}

setup() {
	step /usr/sbin/modprobe crc32_generic || return 1
	step /usr/sbin/modprobe rdma_rxe || return 1
	/usr/sbin/modprobe rdma_ucm || say "rdma_ucm not loaded: rdma_cm tools will not work"
	/usr/sbin/modprobe configfs && mount -t configfs configfs /sys/kernel/config 2>/dev/null
	step /usr/bin/ip link set lo up || return 1
	step /usr/sbin/modprobe siw || return 1
	case $role in
	single)
		netdev=veth0 ip=10.0.0.1 peer=10.0.0.1
		siw_netdev=veth2 siw_ip=10.0.1.1 siw_peer=10.0.1.1
		step /usr/sbin/modprobe veth || return 1
		# Each device its own netdev and subnet: rdma_cm resolves an IP to
		# the device on its netdev, so siw0 beside rxe0 on veth0 would
		# never be chosen.
		for pair in "veth0 veth1 $ip" "veth2 veth3 $siw_ip"; do
			# shellcheck disable=SC2086 # three words
			set -- $pair
			step /usr/bin/ip link add "$1" type veth peer name "$2" || return 1
			if ! /usr/bin/ip link set "$1" mtu "$SR_MTU" || ! /usr/bin/ip link set "$2" mtu "$SR_MTU"; then
				say "could not set MTU $SR_MTU on $1/$2"
			fi
			step /usr/bin/ip addr add "$3/24" dev "$1" || return 1
			step /usr/bin/ip link set "$2" up || return 1
			step /usr/bin/ip link set "$1" up || return 1
		done
		;;
	server | client)
		netdev=eth0 siw_netdev=eth1
		if [ "$role" = server ]; then
			ip=10.0.0.1 peer=10.0.0.2 siw_ip=10.0.1.1 siw_peer=10.0.1.2
		else
			ip=10.0.0.2 peer=10.0.0.1 siw_ip=10.0.1.2 siw_peer=10.0.1.1
		fi
		step /usr/sbin/modprobe virtio_pci || return 1
		step /usr/sbin/modprobe virtio_net || return 1
		for nd in "eth0 $ip" "eth1 $siw_ip"; do
			# shellcheck disable=SC2086 # two words
			set -- $nd
			wait_for 10 test -e "/sys/class/net/$1" || {
				say "$1 did not appear"
				setup_ok=0
				return 1
			}
			/usr/bin/ip link set "$1" mtu "$SR_MTU" || say "could not set MTU $SR_MTU on $1"
			step /usr/bin/ip addr add "$2/24" dev "$1" || return 1
			step /usr/bin/ip link set "$1" up || return 1
		done
		;;
	*)
		say "unknown role $role"
		setup_ok=0
		return 1
		;;
	esac
	step /usr/bin/rdma link add rxe0 type rxe netdev "$netdev" || return 1
	wait_for 15 port_active || {
		say "rxe0 port 1 not ACTIVE: $(cat /sys/class/infiniband/rxe0/ports/1/state 2>&1)"
		setup_ok=0
		return 1
	}
	wait_for 15 gid1_set || {
		say "rxe0 has no GID at index 1"
		setup_ok=0
		return 1
	}
	say "$(/usr/bin/rdma link show rxe0/1)"
	say "rxe0 GID[1] $(cat /sys/class/infiniband/rxe0/ports/1/gids/1), $netdev mtu $(cat "/sys/class/net/$netdev/mtu")"
	step /usr/bin/rdma link add siw0 type siw netdev "$siw_netdev" || return 1
	wait_for 15 port_active siw0 || {
		say "siw0 port 1 not ACTIVE: $(cat /sys/class/infiniband/siw0/ports/1/state 2>&1)"
		setup_ok=0
		return 1
	}
	say "$(/usr/bin/rdma link show siw0/1), $siw_netdev $siw_ip mtu $(cat "/sys/class/net/$siw_netdev/mtu")"
	export SOFTROCE_DEV=rxe0 SOFTROCE_PORT=1 SOFTROCE_GID_INDEX=1 SOFTROCE_NETDEV="$netdev"
	export SOFTROCE_IP="$ip" SOFTROCE_PEER_IP="$peer" SOFTROCE_ROLE="$role"
	export SOFTROCE_SIW_DEV=siw0 SOFTROCE_SIW_NETDEV="$siw_netdev"
	export SOFTROCE_SIW_IP="$siw_ip" SOFTROCE_SIW_PEER_IP="$siw_peer"
	# The devices are the point here: rsock's verbs tests fail, not skip,
	# when they find none (verbstest.RequireEnv).
	export RSOCK_REQUIRE_VERBS=rxe0,siw0
}

setup
# soft-iWARP counts the memory it pins against RLIMIT_MEMLOCK even for root
# (rxe, through the core's ib_umem_get, exempts CAP_IPC_LOCK); the
# kernel's default 8 MiB holds two verbs connections at the default ring.
ulimit -l unlimited || say "could not raise RLIMIT_MEMLOCK"
t_setup=$(now_cs)
if [ "$setup_ok" = 1 ]; then
	say "setup done in $(fmt_secs $((t_setup - t_boot)))s"
	echo "$MARK SETUP OK"
else
	echo "$MARK SETUP FAILED"
	dmesg | tail -n 30
fi

mkdir -p /tmp/softroce
pass=0
fail=0

# run_test NAME CMDFILE
run_test() {
	name=$1
	cmdf=$2
	echo "$MARK BEGIN $name"
	t0=$(now_cs)
	if [ "$setup_ok" != 1 ]; then
		echo "[$name] not run: setup failed"
		rc=255
	else
		fifo=/tmp/.sr.fifo.$name
		tofile=/tmp/.sr.timeout.$name
		rm -f "$fifo" "$tofile"
		mkfifo "$fifo"
		sed "s/^/[$name] /" <"$fifo" &
		lpid=$!
		# setsid: the test is its own process group, so the watchdog and the
		# clean-up below reach whatever it started in the background. (busybox
		# kill takes "-PGID" but not "--": "kill -KILL -- -PGID" fails.)
		(cd /tmp/softroce && exec setsid sh -c ". /etc/softroce/lib.sh; $(cat "$cmdf")") \
			>"$fifo" 2>&1 </dev/null &
		tpid=$!
		(
			sleep "$SR_TEST_TIMEOUT"
			: >"$tofile"
			kill -KILL "-$tpid" 2>/dev/null || kill -KILL "$tpid"
		) >/dev/null 2>&1 &
		wpid=$!
		wait "$tpid"
		rc=$?
		kill "$wpid" 2>/dev/null
		kill -KILL "-$tpid" 2>/dev/null
		# The labeller ends when the last writer is gone; bound it anyway.
		n=30
		while kill -0 "$lpid" 2>/dev/null && [ "$n" -gt 0 ]; do
			sleep 0.1
			n=$((n - 1))
		done
		kill "$lpid" 2>/dev/null
		wait "$lpid" 2>/dev/null
		rm -f "$fifo"
		if [ -e "$tofile" ]; then
			echo "[$name] killed after ${SR_TEST_TIMEOUT}s (test timeout)"
			[ "$rc" != 0 ] || rc=124
		fi
	fi
	t1=$(now_cs)
	if [ "$rc" = 0 ]; then
		status=PASS
		pass=$((pass + 1))
	else
		status=FAIL
		fail=$((fail + 1))
	fi
	echo "$MARK RESULT $name $status rc=$rc secs=$(fmt_secs $((t1 - t0)))"
}

for cmdf in /etc/softroce/tests/*.cmd; do
	[ -e "$cmdf" ] || continue
	run_test "$(cat "${cmdf%.cmd}.name")" "$cmdf"
done

if [ "$fail" != 0 ] && [ "$setup_ok" = 1 ]; then
	say "kernel log tail:"
	dmesg | tail -n 20
fi
t_end=$(now_cs)
say "tests done in $(fmt_secs $((t_end - t_setup)))s, $(fmt_secs "$t_end")s since boot"
echo "$MARK DONE passed=$pass failed=$fail"
poweroff_now
