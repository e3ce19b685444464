#!/usr/bin/env python3
# Splits a CPU profile's samples into categories by their stacks and prints
# microseconds of CPU per request: categories.py BINARY PROFILE REQUESTS ...
import sys,subprocess,re,collections
def cats(binary,prof):
    out=subprocess.run(['go','tool','pprof','-traces',binary,prof],capture_output=True,text=True).stdout
    tot=collections.Counter()
    for block in out.split('-----------+-------------------------------------------------------')[1:]:
        lines=[l for l in block.strip().split('\n') if l.strip()]
        if not lines: continue
        m=re.match(r'\s*([\d.]+)(ms|s)\s+(.*)',lines[0])
        if not m: continue
        v=float(m.group(1))*(1000 if m.group(2)=='s' else 1)
        frames=[m.group(3).strip()]+[l.strip() for l in lines[1:]]
        st=' '.join(frames)
        if re.search(r'rdmanet/internal/stream\.\(\*Conn\)\.spin',st): c='rsock busy-poll (waiting)'
        elif re.search(r'rdmanet/internal/(stream|verbs)|rdmanet/rsock\.',st): c='transport: rsock'
        elif re.search(r'internal/poll\.\(\*FD\)\.(Read|Write|SetReadDeadline|SetWriteDeadline)|net\.\(\*conn\)\.(Read|Write)|runtime_pollSetDeadline|internal/poll\.setDeadlineImpl',st): c='transport: kernel TCP'
        elif re.search(r'runtime\.(gcBgMarkWorker|gcDrain|mallocgc|newobject|makeslice|growslice|gcAssist|bgsweep|scavenge|makemap|rawstring|concatstring)',st): c='allocation and GC'
        elif re.search(r'runtime\.(schedule|findRunnable|park_m|goready|ready|wakep|startm|stopm|futex|notewakeup|netpoll|mcall|gopark|selectgo|chansend|chanrecv|sysmon|runqgrab|stealWork)',st): c='scheduler: park, wake, hand-offs'
        else: c='application: net/http, gRPC, workload'
        tot[c]+=v
    return tot
b=sys.argv[1]
for p,n in zip(sys.argv[2::2],sys.argv[3::2]):
    t=cats(b,p); n=int(n); s=sum(t.values())
    print('%-28s total %6.1f us/req: '%(p.split('/')[-1],s*1000/n)+', '.join('%s %.1f'%(k,v*1000/n) for k,v in sorted(t.items())))
