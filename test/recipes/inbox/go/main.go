// Recipe: a RabbitMQ consumer that applies each message once, through the
// inbox, in Go (pgx v4, amqp091-go).  The same consumer as
// ../python/consumer.py, whose comment says why each step is there:
//
//	IDEM_DSN="host=... dbname=shop user=api password=..." AMQP_URL=amqp://... \
//	    STREAMS=orders.0,orders.1 CONSUMER=billing ./consumer
//
// Each stream (a RabbitMQ queue of type stream) has one goroutine that takes
// its messages one at a time, in offset order, each in one transaction:
// idem_inbox_accept_seq on the offset (the watermark: where a restart reads
// on, and what a second read skips), idem_inbox_accept on the message id
// (a producer's copies), the business change; the ack after the commit.
// Never a goroutine per message: with accept_gap => true, offset 1210
// committed before 1208 makes 1208 a 'duplicate', skipped without a word.
//
// Behind PgBouncer in transaction mode: statement_cache_mode=describe (pgx
// prepares no named statement on a server connection it does not keep), no
// session state.  Any error ends the process; restarted, it reads on from
// the watermarks.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

var consumer = os.Getenv("CONSUMER")

func main() {
	ctx := context.Background()
	if consumer == "" {
		consumer = "billing"
	}
	db, err := pgxpool.Connect(ctx, os.Getenv("IDEM_DSN")+" statement_cache_mode=describe")
	if err != nil {
		log.Fatal(err)
	}
	broker, err := amqp.Dial(os.Getenv("AMQP_URL"))
	if err != nil {
		log.Fatal(err)
	}
	failed := make(chan error)
	for _, stream := range strings.Split(os.Getenv("STREAMS"), ",") {
		go func(stream string) { failed <- consume(ctx, db, broker, stream) }(stream)
	}
	log.Fatal(<-failed)
}

func consume(ctx context.Context, db *pgxpool.Pool, broker *amqp.Connection, stream string) error {
	ch, err := broker.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(100, 0, false); err != nil { // a stream consumer must have a prefetch
		return err
	}
	if _, err := ch.QueueDeclare(stream, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		return err
	}
	var mark *int64
	if err := db.QueryRow(ctx, "SELECT idem_inbox_watermark($1, $2)", consumer, stream).Scan(&mark); err != nil {
		return err
	}
	var start interface{} = "first"
	if mark != nil {
		start = *mark + 1
	}
	deliveries, err := ch.Consume(stream, "", false, false, false, false, amqp.Table{"x-stream-offset": start})
	if err != nil {
		return err
	}
	for d := range deliveries {
		offset, ok := d.Headers["x-stream-offset"].(int64)
		if !ok {
			return fmt.Errorf("%s: a delivery without its offset", stream)
		}
		err := db.BeginFunc(ctx, func(tx pgx.Tx) error {
			var seen string
			err := tx.QueryRow(ctx, "SELECT idem_inbox_accept_seq($1, $2, $3, accept_gap => true)",
				consumer, stream, offset).Scan(&seen)
			if err != nil || seen == "duplicate" {
				return err
			}
			if seen == "gap" {
				log.Printf("%s: offsets before %d were removed unread", stream, offset)
			}
			var first bool
			err = tx.QueryRow(ctx, "SELECT idem_inbox_accept($1, $2)", consumer, d.MessageId).Scan(&first)
			if err != nil || !first {
				return err
			}
			var event struct {
				Order string `json:"order"`
				N     int    `json:"n"`
			}
			if err := json.Unmarshal(d.Body, &event); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO order_events (consumer, order_id, n, message_id, stream, stream_offset)
			                       VALUES ($1, $2, $3, $4, $5, $6)`, consumer, event.Order, event.N, d.MessageId, stream, offset)
			return err
		})
		if err != nil {
			return err
		}
		if err := d.Ack(false); err != nil { // after the commit: duplicates too
			return err
		}
	}
	return amqp.ErrClosed
}
