# shellcheck shell=dash
# Helpers for test commands in the Soft-RoCE guest (busybox sh). /init sources
# this file before each test command, as /etc/softroce/lib.sh.
#
# The environment: SOFTROCE_DEV (rxe0), SOFTROCE_PORT (1), SOFTROCE_GID_INDEX
# (1: the IPv4-mapped RoCE v2 GID), SOFTROCE_NETDEV, SOFTROCE_IP,
# SOFTROCE_PEER_IP (own IP when single) and SOFTROCE_ROLE (single, or server
# and client with --two-hosts); for soft-iWARP on its own netdev and subnet,
# SOFTROCE_SIW_DEV (siw0), SOFTROCE_SIW_NETDEV, SOFTROCE_SIW_IP and
# SOFTROCE_SIW_PEER_IP.

# sr_now: whole seconds since boot.
sr_now() {
	read -r _up _ </proc/uptime
	echo "${_up%%.*}"
}

# sr_devinfo [DEV [TRANSPORT]]: ibv_devinfo of DEV (default $SOFTROCE_DEV);
# fails unless its port is active and, if given, its transport is
# TRANSPORT (InfiniBand for RoCE, iWARP).
sr_devinfo() {
	_dev=${1:-$SOFTROCE_DEV}
	_out=$(ibv_devinfo -d "$_dev" 2>&1)
	_rc=$?
	echo "$_out"
	[ "$_rc" = 0 ] || return "$_rc"
	if [ -n "${2:-}" ] && ! echo "$_out" | grep -q "transport:[[:space:]]*$2"; then
		echo "$_dev's transport is not $2"
		return 1
	fi
	echo "$_out" | grep -q 'state:[[:space:]]*PORT_ACTIVE' || {
		echo "port of $_dev is not PORT_ACTIVE"
		return 1
	}
}

# sr_wait_listen PORT SECS: wait until a TCP socket listens on PORT.
sr_wait_listen() {
	_hex=$(printf '%04X' "$1")
	_n=$(($2 * 10))
	while ! awk -v p="$_hex" '
		$4 == "0A" { split($2, a, ":"); if (a[2] == p) found = 1 }
		END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
		_n=$((_n - 1))
		[ "$_n" -gt 0 ] || return 1
		sleep 0.1
	done
}

# sr_wait_ping IP SECS: wait until IP answers a ping.
sr_wait_ping() {
	_end=$(($(sr_now) + $2))
	until ping -c 1 -W 1 "$1" >/dev/null 2>&1; do
		[ "$(sr_now)" -lt "$_end" ] || return 1
	done
}

# sr_rc_pingpong [ITERS]: ibv_rc_pingpong on $SOFTROCE_DEV with GID index
# $SOFTROCE_GID_INDEX. single: server and client on the one device, the
# client connecting to the guest's own IP. server / client (--two-hosts): one
# side each; the client waits for the peer and retries until the server
# listens (at most SR_CONNECT_SECS, default 60).
sr_rc_pingpong() {
	_iters=${1:-1000}
	set -- -d "$SOFTROCE_DEV" -i "$SOFTROCE_PORT" -g "$SOFTROCE_GID_INDEX" -n "$_iters"
	case ${SOFTROCE_ROLE:-single} in
	single)
		rm -f /tmp/.pp.src /tmp/.pp.crc /tmp/.pp.spid
		{
			ibv_rc_pingpong "$@" &
			echo $! >/tmp/.pp.spid
			wait $!
			echo $? >/tmp/.pp.src
		} 2>&1 | sed 's/^/server: /' &
		_spipe=$!
		if sr_wait_listen 18515 20; then
			{
				ibv_rc_pingpong "$@" "$SOFTROCE_IP"
				echo $? >/tmp/.pp.crc
			} 2>&1 | sed 's/^/client: /'
		else
			echo "ibv_rc_pingpong server did not listen on port 18515"
		fi
		_crc=$(cat /tmp/.pp.crc 2>/dev/null || echo none)
		# A server whose client failed would wait for ever.
		[ "$_crc" = 0 ] || kill "$(cat /tmp/.pp.spid)" 2>/dev/null
		wait "$_spipe"
		_src=$(cat /tmp/.pp.src 2>/dev/null || echo none)
		echo "client exit $_crc, server exit $_src"
		[ "$_src" = 0 ] && [ "$_crc" = 0 ]
		;;
	server)
		ibv_rc_pingpong "$@"
		;;
	client)
		_end=$(($(sr_now) + ${SR_CONNECT_SECS:-60}))
		sr_wait_ping "$SOFTROCE_PEER_IP" "${SR_CONNECT_SECS:-60}" || {
			echo "peer $SOFTROCE_PEER_IP does not answer ping"
			return 1
		}
		echo "peer $SOFTROCE_PEER_IP answers ping"
		while :; do
			_out=$(ibv_rc_pingpong "$@" "$SOFTROCE_PEER_IP" 2>&1)
			_rc=$?
			echo "$_out"
			[ "$_rc" != 0 ] || return 0
			case $_out in
			*"Couldn't connect"*) ;;
			*) return "$_rc" ;;
			esac
			[ "$(sr_now)" -lt "$_end" ] || return "$_rc"
			sleep 1
		done
		;;
	*)
		echo "unknown SOFTROCE_ROLE '$SOFTROCE_ROLE'"
		return 1
		;;
	esac
}

# sr_rping [COUNT]: rping (rdma_cm) on siw0's own IP, server and client in
# this guest; the client starts once the server's iWARP listener (a real
# TCP socket) is up. In two-guest mode each guest checks its own siw0 this
# way: across guests an rping client that finds no listener yet hangs
# (softiwarp.md), and rsock's two-host test covers that path with retries.
sr_rping() {
	_count=${1:-10}
	rm -f /tmp/.rp.src /tmp/.rp.crc
	{
		timeout 100 rping -s -a "$SOFTROCE_SIW_IP" -p 7174 -C "$_count" -v
		echo $? >/tmp/.rp.src
	} 2>&1 | sed 's/^/server: /' &
	_spipe=$!
	if sr_wait_listen 7174 20; then
		{
			timeout 60 rping -c -a "$SOFTROCE_SIW_IP" -p 7174 -C "$_count" -v
			echo $? >/tmp/.rp.crc
		} 2>&1 | sed 's/^/client: /'
	else
		echo "rping server did not listen on port 7174"
	fi
	_crc=$(cat /tmp/.rp.crc 2>/dev/null || echo none)
	# A server whose client failed would wait for its timeout.
	[ "$_crc" = 0 ] || killall rping 2>/dev/null
	wait "$_spipe"
	_src=$(cat /tmp/.rp.src 2>/dev/null || echo none)
	echo "client exit $_crc, server exit $_src"
	[ "$_src" = 0 ] && [ "$_crc" = 0 ]
}
