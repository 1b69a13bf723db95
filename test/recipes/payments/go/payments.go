// POST /payments: a charge at a payment provider, at most once per
// Idempotency-Key, with pgx v4 behind PgBouncer in transaction mode.
//  1. claim the key in autocommit: the claim commits alone, and no
//     transaction stays open across the provider call;
//  2. checkpoint 'provider-call', extending the lease past the call's timeout;
//  3. call the provider outside any transaction, the key as its payment id;
//  4. complete with the payment row in one transaction (201), fail on a
//     refusal (4xx: saved and replayed), or mark unknown when no answer
//     tells (202);
//  5. a reconciler goroutine in every instance settles the unknown payments
//     by asking the provider.
//
// Environment: IDEM_DSN (libpq), PROVIDER_URL, PORT, PROVIDER_TIMEOUT
// (seconds, 5), RECONCILE_AFTER (30), RECONCILE_EVERY (10).  Table:
// ../schema.sql.  Built with Debian's golang-go and
// golang-github-jackc-pgx-v4-dev, nothing downloaded:
// GO111MODULE=off GOPATH=/usr/share/gocode go build -o payments payments.go
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

var (
	providerTimeout = seconds("PROVIDER_TIMEOUT", 5)
	// The lease outlasts the provider call: until it runs out a retry gets
	// 409, never a takeover that calls the provider while this call may land.
	lease          = providerTimeout + 10
	reconcileAfter = seconds("RECONCILE_AFTER", 30)
	reconcileEvery = seconds("RECONCILE_EVERY", 10)
	keyRe          = regexp.MustCompile(`^"([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})"$`) // Idempotency-Key: "..."
	client         = &http.Client{Timeout: time.Duration(providerTimeout * float64(time.Second))}
	pending        = map[string]string{"status": "pending"}
	pool           *pgxpool.Pool
)

func seconds(name string, otherwise float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return otherwise
}

type answer struct {
	status   int
	body     interface{}
	replayed bool
}

// payment: the provider's charge of a key, also the 201's body.
type payment struct {
	PaymentID string `json:"payment_id"`
	ChargeID  string `json:"charge_id"`
	Amount    int    `json:"amount"`
}

// provider: the status and body; an error when no whole answer came within
// the timeout (it covers the body): then the charge may or may not exist.
func provider(method, path string, body interface{}) (int, []byte, error) {
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, os.Getenv("PROVIDER_URL")+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	data, err = io.ReadAll(res.Body)
	return res.StatusCode, data, err
}

func chargeOf(key string, status int, data []byte) *payment {
	p := payment{PaymentID: key}
	if (status == 200 || status == 201) && json.Unmarshal(data, &p) == nil && p.ChargeID != "" {
		return &p
	}
	return nil
}

// save: the answer saved by finish (args) and the payment row commit together.
func save(ctx context.Context, p *payment, finish string, args ...interface{}) error {
	return pool.BeginFunc(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, finish, args...); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO charges (key, charge_id, amount) VALUES ($1, $2, $3)",
			p.PaymentID, p.ChargeID, p.Amount)
		return err
	})
}

func pay(ctx context.Context, key string, raw []byte, amount int) (answer, error) {
	var outcome string
	var token *int64
	var code *int32
	var saved *string
	if err := pool.QueryRow(ctx, `SELECT outcome, token, response_code, coalesce(result, error)::text
		  FROM idem_claim($1, idem_request_fingerprint('POST', '/payments', $2::jsonb),
		                  lease => make_interval(secs => $3), scope => 'payments')`,
		key, string(raw), lease).Scan(&outcome, &token, &code, &saved); err != nil {
		return answer{}, err
	}
	switch outcome {
	case "replay":
		return answer{int(*code), json.RawMessage(*saved), true}, nil
	case "unknown": // the reconciler settles it
		return answer{202, pending, false}, nil
	case "in_progress": // another request holds the lease
		return answer{409, map[string]string{"error": "in progress"}, false}, nil
	}
	// new, or takeover (a lease ran out, or the reconciler found no charge):
	// charging again under the same payment id is safe, since the provider
	// answers a repeated id with its first charge
	if _, err := pool.Exec(ctx, `SELECT idem_checkpoint($1, $2, 'provider-call', scope => 'payments',
		  extend_lease => make_interval(secs => $3))`, key, *token, lease); err != nil {
		return answer{}, err
	}
	// no transaction open and no connection held meanwhile
	status, data, err := provider("POST", "/charges", map[string]interface{}{"payment_id": key, "amount": amount})
	if err != nil { // a timeout, a reset, half a body
		status = 0
	}
	if p := chargeOf(key, status, data); p != nil {
		err := save(ctx, p, "SELECT idem_complete($1, $2, $3, 201, scope => 'payments')", key, *token, p)
		return answer{201, p, false}, err
	}
	if status >= 400 && status < 500 && status != 429 {
		// a refusal (402: declined): saved, so that a retry gets it again
		if !json.Valid(data) {
			data = []byte(`{"error": "refused"}`)
		}
		_, err := pool.Exec(ctx, `SELECT idem_fail($1, $2, $3::jsonb, retryable => false, scope => 'payments',
			  response_code => $4)`, key, *token, string(data), status)
		return answer{status, json.RawMessage(data), false}, err
	}
	// no answer, a 5xx or 429, a body that is no charge: it may have charged
	_, err = pool.Exec(ctx, "SELECT idem_mark_unknown($1, $2, $3, scope => 'payments')",
		key, *token, map[string]int{"provider_status": status})
	return answer{202, pending, false}, err
}

// reconcile settles the unknown payments older than RECONCILE_AFTER (a POST
// that timed out may land late) from the provider's records.  Every
// instance runs it: a second idem_resolve of a key waits for the first's
// transaction, then gets IK003 (so save runs it before the INSERT).
func reconcile(ctx context.Context) error {
	var keys []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(key), '{}') FROM idempotency_records
		 WHERE scope = 'payments' AND status = 'unknown' AND recovery_point = 'provider-call'
		   AND updated_at < now() - make_interval(secs => $1)`, reconcileAfter).Scan(&keys); err != nil {
		return err
	}
	for _, key := range keys {
		status, data, err := provider("GET", "/charges/"+url.PathEscape(key), nil)
		p := chargeOf(key, status, data)
		if err != nil || (p == nil && status != 404) {
			continue // no answer, a 5xx: left for the next run
		}
		if p != nil { // it happened: save the answer, and it
			err = save(ctx, p, "SELECT idem_resolve($1, 'succeeded', $2, 201, 'payments')", key, p)
		} else { // it did not: the client's retry charges
			_, err = pool.Exec(ctx, `SELECT idem_resolve($1, 'failed', '{"error": "no charge"}',
				  scope => 'payments', retryable => true)`, key)
		}
		if err != nil && sqlstate(err) != "IK003" { // IK003: another instance settled it first
			return err
		}
	}
	return nil
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func serve(r *http.Request) answer {
	raw, _ := io.ReadAll(r.Body)
	key := keyRe.FindStringSubmatch(r.Header.Get("Idempotency-Key"))
	var req struct {
		Amount *int `json:"amount"`
	}
	if key == nil || json.Unmarshal(raw, &req) != nil || req.Amount == nil {
		return answer{400, map[string]string{"error": `send Idempotency-Key: "..." and {"amount": <int>}`}, false}
	}
	// not the request's context: a client that hangs up must not stop the work half way
	a, err := pay(context.Background(), key[1], raw, *req.Amount)
	if err == nil {
		return a
	}
	switch sqlstate(err) {
	case "IK001": // the key came with another request
		return answer{422, map[string]string{"error": "Idempotency-Key reused for another request"}, false}
	case "IK002": // our lease ran out, another attempt took over
		return answer{409, map[string]string{"error": "superseded"}, false}
	}
	log.Print(err)
	return answer{500, map[string]string{"error": sqlstate(err)}, false}
}

func main() {
	var err error
	// PgBouncer, transaction mode: pgx's statement cache would prepare each
	// query as a named statement of one server connection; "describe" only
	// keeps the types it learns and runs every query as the unnamed statement.
	pool, err = pgxpool.Connect(context.Background(),
		os.Getenv("IDEM_DSN")+" statement_cache_mode=describe pool_max_conns=4")
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for range time.Tick(time.Duration(reconcileEvery * float64(time.Second))) {
			if err := reconcile(context.Background()); err != nil {
				log.Print("reconcile: ", err)
			}
		}
	}()
	http.HandleFunc("/payments", func(w http.ResponseWriter, r *http.Request) {
		a := serve(r)
		w.Header().Set("Content-Type", "application/json")
		if a.replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		if a.status == 409 {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(a.status)
		json.NewEncoder(w).Encode(a.body)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil))
}
