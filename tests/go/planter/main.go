// Command planter is a hostile function for the run-lifetime tests
// (tests/tests/run_lifetime.rs): it leaves behind, once it has exited, a
// process that holds what a later call might find.
//
//	planter plant PORT NAME MIB
//
// starts a copy of itself in the background ("hold") that listens on TCP
// 127.0.0.1:PORT, binds the abstract unix socket NAME, takes an OFD lock on a
// file in /tmp and holds MIB MiB of memory it has touched (freeing it makes
// the copy's exit slow: the kernel closes a dying process's files only after
// it has freed its memory). Once the copy holds all of it, planter prints a
// minimal FunctionIO and exits 0, leaving the copy running.
package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 5 {
		fail("usage: planter plant|hold PORT NAME MIB")
	}
	port, name := os.Args[2], os.Args[3]
	mib, err := strconv.Atoi(os.Args[4])
	if err != nil {
		fail("MIB: %v", err)
	}
	switch os.Args[1] {
	case "plant":
		plant(port, name, mib)
	case "hold":
		hold(port, name, mib)
	default:
		fail("unknown mode %q", os.Args[1])
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "planter: "+format+"\n", args...)
	os.Exit(1)
}

// plant starts the holder, waits for its "ok" and answers.
func plant(port, name string, mib int) {
	r, w, err := os.Pipe()
	if err != nil {
		fail("pipe: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		fail("executable: %v", err)
	}
	cmd := exec.Command(self, "hold", port, name, strconv.Itoa(mib))
	// Stdio to /dev/null: the run's stdout must close when planter exits.
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		fail("start the holder: %v", err)
	}
	w.Close()
	buf := make([]byte, 3)
	n, _ := r.Read(buf)
	if string(buf[:n]) != "ok\n" {
		fail("the holder did not get ready: %q", buf[:n])
	}
	fmt.Print("observed: {}\ndesired: {}\n")
}

// hold takes every resource, says "ok" on fd 3 and waits to be killed.
func hold(port, name string, mib int) {
	tcp, err := net.Listen("tcp4", "127.0.0.1:"+port)
	if err != nil {
		fail("listen on port %s: %v", port, err)
	}
	unix, err := net.Listen("unix", "@"+name)
	if err != nil {
		fail("bind @%s: %v", name, err)
	}
	lock, err := os.Create("/tmp/planter.lock")
	if err != nil {
		fail("lock file: %v", err)
	}
	flock := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0}
	// F_OFD_SETLK (37): a lock of the open file, not of the process.
	if err := syscall.FcntlFlock(lock.Fd(), 37, &flock); err != nil {
		fail("OFD lock: %v", err)
	}
	memory := make([]byte, mib<<20)
	for i := 0; i < len(memory); i += 4096 {
		memory[i] = 1
	}
	ready := os.NewFile(3, "ready")
	ready.Write([]byte("ok\n"))
	ready.Close()
	for {
		time.Sleep(time.Hour)
		// Keep everything reachable.
		_, _, _ = tcp, unix, memory[0]
	}
}
