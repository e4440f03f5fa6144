package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/wal"
)

// stageLog records the stages of fake commit jobs in the order they end.
type stageLog struct {
	mu     sync.Mutex
	events []string
}

func (l *stageLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
}

func (l *stageLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// fakeJobs starts n commit jobs back to back, chained like run chains
// them, with the given stages; a job is named by its index in job.end.
func fakeJobs(p *Pipeline, n int) []*commitJob {
	var f []*commitJob
	for i := range n {
		var prev *commitJob
		if len(f) > 0 {
			prev = f[len(f)-1]
		}
		ctx, cancel := context.WithCancel(context.Background())
		f = append(f, p.startCommit(ctx, cancel, &commitJob{end: wal.LSN(i)}, prev))
	}
	return f
}

// TestCommitStagesOverlapInOrder: a batch's target commit overlaps the
// previous batch's state commit (job 0's state waits until job 1's target
// is done: without the overlap this test would time out), while target
// commits, state commits and acknowledgements each keep the batches' order.
func TestCommitStagesOverlapInOrder(t *testing.T) {
	t.Parallel()
	log := &stageLog{}
	secondTarget := make(chan struct{})
	p := &Pipeline{stages: &commitStages{
		target: func(_ context.Context, job *commitJob) error {
			time.Sleep(time.Duration(3-job.end) * 5 * time.Millisecond) // later jobs are quicker
			log.add("T%d", job.end)
			if job.end == 1 {
				close(secondTarget)
			}
			return nil
		},
		state: func(_ context.Context, job *commitJob) error {
			if job.end == 0 {
				select {
				case <-secondTarget:
				case <-time.After(10 * time.Second):
					return errors.New("job 1's target never ran while job 0's state was committing")
				}
			}
			log.add("S%d", job.end)
			return nil
		},
	}}
	f := fakeJobs(p, 4)
	if err := p.waitAll(f); err != nil {
		t.Fatal(err)
	}
	var targets, states []string
	pos := map[string]int{}
	for i, e := range log.get() {
		pos[e] = i
		if e[0] == 'T' {
			targets = append(targets, e)
		} else {
			states = append(states, e)
		}
	}
	if want := []string{"T0", "T1", "T2", "T3"}; !slices.Equal(targets, want) {
		t.Errorf("target commits %v, want %v", targets, want)
	}
	if want := []string{"S0", "S1", "S2", "S3"}; !slices.Equal(states, want) {
		t.Errorf("state commits %v, want %v", states, want)
	}
	for i := range 4 {
		if pos[fmt.Sprintf("S%d", i)] < pos[fmt.Sprintf("T%d", i)] {
			t.Errorf("job %d's state committed before its target: %v", i, log.get())
		}
	}
}

// TestCommitStagesFailure: a failed target commit ends every later job
// before its target stage; a failed state commit ends every later job
// before its state stage (their targets may be committed: a restart
// replays them for Redis only); waitAll and trim report the first error.
func TestCommitStagesFailure(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, failIn := range []string{"target", "state"} {
		t.Run(failIn, func(t *testing.T) {
			t.Parallel()
			log := &stageLog{}
			p := &Pipeline{stages: &commitStages{
				target: func(_ context.Context, job *commitJob) error {
					if failIn == "target" && job.end == 1 {
						return boom
					}
					log.add("T%d", job.end)
					return nil
				},
				state: func(_ context.Context, job *commitJob) error {
					if failIn == "state" && job.end == 1 {
						return boom
					}
					log.add("S%d", job.end)
					return nil
				},
			}}
			f := fakeJobs(p, 4)
			if err := p.waitAll(f); !errors.Is(err, boom) {
				t.Fatalf("waitAll = %v, want the failure", err)
			}
			for _, job := range f[2:] {
				if !errors.Is(job.err, errEarlierFailed) {
					t.Errorf("job %d ended with %v, want errEarlierFailed", job.end, job.err)
				}
			}
			if _, err := p.trim(f); !errors.Is(err, boom) {
				t.Errorf("trim = %v, want the failure", err)
			}
			got := log.get()
			if slices.Contains(got, "S1") || slices.Contains(got, "S2") || slices.Contains(got, "S3") {
				t.Errorf("a state was committed after a failed batch: %v", got)
			}
			if failIn == "target" && (slices.Contains(got, "T2") || slices.Contains(got, "T3")) {
				t.Errorf("a target was committed after a failed target commit: %v", got)
			}
			if !slices.Contains(got, "S0") {
				t.Errorf("the batch before the failure did not commit: %v", got)
			}
		})
	}
}

// TestCommitStagesShutdown: the batch in hand finishes after shutdown
// begins, within the grace period (its context outlives the daemon's by
// the grace), and fails when it outlasts it.
func TestCommitStagesShutdown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		grace time.Duration
		ok    bool
	}{{2 * time.Second, true}, {20 * time.Millisecond, false}} {
		stop, shutdown := context.WithCancel(context.Background())
		started := make(chan struct{})
		p := &Pipeline{stages: &commitStages{
			target: func(ctx context.Context, _ *commitJob) error {
				close(started)
				select {
				case <-time.After(200 * time.Millisecond):
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			},
			state: func(ctx context.Context, _ *commitJob) error { return ctx.Err() },
		}}
		bctx, cancel := afterGrace(stop, c.grace)
		job := p.startCommit(bctx, cancel, &commitJob{}, nil)
		<-started
		shutdown() // SIGTERM while the batch is mid-commit
		err := p.wait(job)
		if c.ok && err != nil {
			t.Errorf("grace %s: the batch in hand failed: %v", c.grace, err)
		}
		if !c.ok && err == nil {
			t.Errorf("grace %s: a batch outlasting the grace succeeded", c.grace)
		}
	}
}
