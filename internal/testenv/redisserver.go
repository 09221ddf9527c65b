package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a private redis-server child process, for tests that stop,
// restart or freeze Redis.
type RedisServer struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// RedisOptions says how StartRedisServer runs redis-server.
type RedisOptions struct {
	Addr  string // host:port to listen on; a free loopback port when empty
	Dir   string // working directory, holding redis.log; none when empty
	Debug bool   // enable the DEBUG command (DEBUG SLEEP freezes the server)
}

// StartRedisServer starts redis-server (which must be on PATH) without
// persistence and waits until it answers PING. The caller stops it.
func StartRedisServer(o RedisOptions) (*RedisServer, error) {
	if o.Addr == "" {
		ports, err := FreePorts(1)
		if err != nil {
			return nil, err
		}
		o.Addr = "127.0.0.1:" + strconv.Itoa(ports[0])
	}
	_, port, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, err
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}
	if o.Dir != "" {
		if err := os.MkdirAll(o.Dir, 0o755); err != nil {
			return nil, err
		}
		args = append(args, "--dir", o.Dir, "--logfile", filepath.Join(o.Dir, "redis.log"))
	}
	if o.Debug {
		args = append(args, "--enable-debug-command", "yes")
	}
	s := &RedisServer{Addr: o.Addr, cmd: exec.Command("redis-server", args...), done: make(chan struct{})}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	if err := s.waitPing(o.Dir); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitPing waits up to 20 seconds until the server answers PING.
func (s *RedisServer) waitPing(dir string) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			var log []byte
			if dir != "" {
				log, _ = os.ReadFile(filepath.Join(dir, "redis.log"))
			}
			return fmt.Errorf("redis-server on %s exited at start (port taken?):\n%s", s.Addr, log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s does not answer PING after 20s: %v", s.Addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop kills the server and waits until it has exited.
func (s *RedisServer) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Kill()
	<-s.done
}
