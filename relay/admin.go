package relay

import (
	"context"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/relay/admit"
	"github.com/hoplink/hoplink/routectl"
)

// adminBackend answers the operator's admin API calls (adminapi) from the
// relay's measurer and its status, after admit let them through.
type adminBackend struct {
	m      *measurer
	status func() *adminapi.Status
	board  *adminapi.Board // nil: the relay publishes nothing
}

// ClusterSet serves what the operator published for other clusters: the
// operator's and observers' to read (admit.AdminStatus).
func (a adminBackend) ClusterSet(ctx context.Context, client, after string, wait time.Duration) ([]byte, string, error) {
	if ref := admit.AdminStatus(client); ref != nil {
		return nil, "", adminapi.NotFound(ref.Reason, ref)
	}
	if a.board == nil {
		return nil, "", nil
	}
	data, version, _ := a.board.Get(ctx, after, wait)
	return data, version, nil
}

func (a adminBackend) Status(_ context.Context, client string) (*adminapi.Status, error) {
	if ref := admit.AdminStatus(client); ref != nil {
		return nil, adminapi.NotFound(ref.Reason, ref)
	}
	return a.status(), nil
}

func (a adminBackend) admit(client string, call admit.AdminCall, chain string) (*v1alpha1.Chain, error) {
	c, ref := admit.Admin(a.m.manifests(), a.m.name, client, call, chain)
	if ref != nil {
		return nil, adminapi.NotFound(ref.Reason, ref)
	}
	return c, nil
}

func (a adminBackend) Links(ctx context.Context, client, chain string, fresh time.Duration) (*measure.Table, error) {
	c, err := a.admit(client, admit.AdminLinks, chain)
	if err != nil {
		return nil, err
	}
	interval := routectl.Interval(c)
	if fresh < 0 {
		fresh = interval / 4
	}
	ctx, cancel := context.WithTimeout(ctx, routectl.ProbeWait(interval))
	defer cancel()
	return a.m.table(ctx, c, min(fresh, interval)), nil
}

func (a adminBackend) Trace(ctx context.Context, client, chain string, routes [][]string) ([]measure.Trace, error) {
	c, err := a.admit(client, admit.AdminTrace, chain)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, routectl.Interval(c))
	defer cancel()
	return a.m.Trace(ctx, c, routes)
}
