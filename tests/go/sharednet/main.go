// Command sharednet is the function of the shared network namespace tests
// (tests/tests/shared_netns.rs): one image, one kind of run, whose calls do
// what their input says (a comment line in the FunctionIO), so that the calls
// of one kind can plant things and look for them.
//
//	sharednet [TAG]
//
// With "# leave" in its input it leaves all it can behind: a background
// process ("hold") that listens on TCP 127.0.0.1:9443, binds an abstract
// unix socket, and keeps a second TCP listener (127.0.0.1:9444) alive only
// in flight in a unix socket's own queue (a cycle only the kernel's garbage
// collector ends); SysV shared memory, a semaphore set and a message queue;
// a POSIX message queue. It tries to set the hostname, to add an address and a
// route to lo, to set sysctls and to make a TCP fast open attempt (which
// records its MSS in tcp_metrics), and reports which of those worked.
//
// With "# wait" it sleeps 4 s first. Every call then reports its network
// namespace and, unless its input says "# quiet" (a call that opens no
// socket), looks for what a "leave" call leaves and reports what it
// found, in one Normal result.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

const (
	ipcKey   = 0x5eed
	abstract = "@fnrun-sharednet"
	mqName   = "fnrun-sharednet"
	planted  = "planted"
	ipcCreat = 0o1000
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hold" {
		hold()
		return
	}
	input, _ := io.ReadAll(os.Stdin)
	var report []string
	if strings.Contains(string(input), "# leave") {
		report = append(report, "worked="+strings.Join(leave(), ","))
	}
	if strings.Contains(string(input), "# wait") {
		time.Sleep(4 * time.Second)
	}
	ns, _ := os.Readlink("/proc/self/ns/net")
	report = append(report, "netns="+ns)
	if !strings.Contains(string(input), "# quiet") {
		report = append(report, "found="+strings.Join(look(), ","))
	}
	fmt.Printf("observed: {}\ndesired: {}\nresults:\n- severity: Normal\n  message: %q\n",
		strings.Join(report, " "))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sharednet: "+format+"\n", args...)
	os.Exit(1)
}

func sys(trap, a1, a2, a3 uintptr) (uintptr, error) {
	r, _, errno := syscall.Syscall(trap, a1, a2, a3)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

func mqOpen(flags int) error {
	name, _ := syscall.BytePtrFromString(mqName)
	fd, err := sys(syscall.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), uintptr(flags), 0o600)
	if err == nil {
		syscall.Close(int(fd))
	}
	return err
}

// ifreq with a sockaddr_in, for SIOCSIFADDR.
type ifreqAddr struct {
	name [16]byte
	addr syscall.RawSockaddrInet4
	_    [8]byte
}

// leave plants everything, and says which of the things a run must not
// be able to do worked.
func leave() []string {
	r, w, err := os.Pipe()
	if err != nil {
		fail("pipe: %v", err)
	}
	self, _ := os.Executable()
	cmd := exec.Command(self, "hold")
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		fail("start the holder: %v", err)
	}
	w.Close()
	buf := make([]byte, 64)
	n, _ := r.Read(buf)
	if string(buf[:n]) != "ok\n" {
		fail("the holder did not get ready: %q", buf[:n])
	}
	if _, err := sys(syscall.SYS_SHMGET, ipcKey, 4096, ipcCreat|0o600); err != nil {
		fail("shmget: %v", err)
	}
	if _, err := sys(syscall.SYS_SEMGET, ipcKey, 1, ipcCreat|0o600); err != nil {
		fail("semget: %v", err)
	}
	if _, err := sys(syscall.SYS_MSGGET, ipcKey, ipcCreat|0o600, 0); err != nil {
		fail("msgget: %v", err)
	}
	if err := mqOpen(syscall.O_CREAT | syscall.O_RDWR); err != nil {
		fail("mq_open: %v", err)
	}
	var worked []string
	// A run holds no capability: this must fail (a new UTS namespace
	// per run all the same).
	if syscall.Sethostname([]byte(planted)) == nil {
		worked = append(worked, "hostname")
	}
	sock, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	if err != nil {
		fail("socket: %v", err)
	}
	req := ifreqAddr{addr: syscall.RawSockaddrInet4{Family: syscall.AF_INET, Addr: [4]byte{10, 9, 9, 9}}}
	copy(req.name[:], "lo:9")
	if _, err := sys(syscall.SYS_IOCTL, uintptr(sock), syscall.SIOCSIFADDR, uintptr(unsafe.Pointer(&req))); err == nil {
		worked = append(worked, "address")
	}
	// struct rtentry: a route to 10.8.0.0/16 on lo.
	var rt [120]byte
	dst := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&rt[8]))
	*dst = syscall.RawSockaddrInet4{Family: syscall.AF_INET, Addr: [4]byte{10, 8, 0, 0}}
	mask := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&rt[40]))
	*mask = syscall.RawSockaddrInet4{Family: syscall.AF_INET, Addr: [4]byte{255, 255, 0, 0}}
	gw := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&rt[24]))
	gw.Family = syscall.AF_INET
	*(*uint16)(unsafe.Pointer(&rt[56])) = syscall.RTF_UP
	lo, _ := syscall.BytePtrFromString("lo")
	*(*uintptr)(unsafe.Pointer(&rt[88])) = uintptr(unsafe.Pointer(lo))
	if _, err := sys(syscall.SYS_IOCTL, uintptr(sock), syscall.SIOCADDRT, uintptr(unsafe.Pointer(&rt[0]))); err == nil {
		worked = append(worked, "route")
	}
	syscall.Close(sock)
	for _, s := range []string{"ipv4/ip_forward", "ipv4/tcp_no_metrics_save", "ipv4/tcp_fastopen"} {
		if os.WriteFile("/proc/sys/net/"+s, []byte("1"), 0) == nil {
			worked = append(worked, "sysctl:"+s)
		}
	}
	// A fast open attempt to the holder's listener, then a plain
	// connection closed by this side.
	fo, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		to := &syscall.SockaddrInet4{Port: 9443, Addr: [4]byte{127, 0, 0, 1}}
		if syscall.Sendto(fo, []byte("x"), syscall.MSG_FASTOPEN, to) == nil {
			worked = append(worked, "fastopen")
		}
		syscall.Close(fo)
	}
	return worked
}

// hold takes what a run must not leave behind, says "ok" on fd 3 and
// waits to be killed.
func hold() {
	tcp, err := net.Listen("tcp4", "127.0.0.1:9443")
	if err != nil {
		fail("listen on 9443: %v", err)
	}
	unix, err := net.Listen("unix", abstract)
	if err != nil {
		fail("bind %s: %v", abstract, err)
	}
	// A listener in flight: sent over a socket pair into the queue of the
	// end that is sent along with it, then closed here.
	inflight, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		fail("socket: %v", err)
	}
	syscall.SetsockoptInt(inflight, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(inflight, &syscall.SockaddrInet4{Port: 9444, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		fail("bind 9444: %v", err)
	}
	if err := syscall.Listen(inflight, 1); err != nil {
		fail("listen on 9444: %v", err)
	}
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		fail("socketpair: %v", err)
	}
	rights := syscall.UnixRights(inflight, pair[0])
	if err := syscall.Sendmsg(pair[1], []byte("x"), rights, nil, 0); err != nil {
		fail("sendmsg: %v", err)
	}
	syscall.Close(inflight)
	syscall.Close(pair[0])
	syscall.Close(pair[1])
	ready := os.NewFile(3, "ready")
	ready.Write([]byte("ok\n"))
	ready.Close()
	for {
		time.Sleep(time.Hour)
		_, _ = tcp, unix
	}
}

func rows(path string) int {
	text, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	return len(lines) - 1
}

// look says what of a "leave" call it finds.
func look() []string {
	var found []string
	for _, port := range []string{"9443", "9444"} {
		if c, err := net.DialTimeout("tcp4", "127.0.0.1:"+port, time.Second); err == nil {
			c.Close()
			found = append(found, "tcp:"+port)
		}
		// The port is free to bind, even without SO_REUSEADDR.
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
		if err == nil {
			var p int
			fmt.Sscan(port, &p)
			if syscall.Bind(fd, &syscall.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}}) != nil {
				found = append(found, "bound:"+port)
			}
			syscall.Close(fd)
		}
	}
	if c, err := net.Dial("unix", abstract); err == nil {
		c.Close()
		found = append(found, "abstract")
	}
	if _, err := sys(syscall.SYS_SHMGET, ipcKey, 0, 0); err == nil {
		found = append(found, "shm")
	}
	if _, err := sys(syscall.SYS_SEMGET, ipcKey, 0, 0); err == nil {
		found = append(found, "sem")
	}
	if _, err := sys(syscall.SYS_MSGGET, ipcKey, 0, 0); err == nil {
		found = append(found, "msg")
	}
	if mqOpen(syscall.O_RDWR) == nil {
		found = append(found, "mqueue")
	}
	if name, _ := os.Hostname(); name == planted {
		found = append(found, "hostname")
	}
	for _, f := range []string{"tcp", "tcp6", "udp", "udp6", "raw", "raw6", "unix", "packet", "route", "ip6_flowlabel"} {
		if n := rows("/proc/net/" + f); n > 0 {
			found = append(found, fmt.Sprintf("/proc/net/%s:%d", f, n))
		}
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if s := a.String(); s != "127.0.0.1/8" && s != "::1/128" {
			found = append(found, "address:"+s)
		}
	}
	for _, s := range []string{"ipv4/ip_forward", "ipv4/tcp_no_metrics_save", "ipv4/tcp_fastopen"} {
		v, _ := os.ReadFile("/proc/sys/net/" + s)
		found = append(found, "sysctl:"+s+"="+strings.TrimSpace(string(v)))
	}
	sort.Strings(found)
	return found
}
