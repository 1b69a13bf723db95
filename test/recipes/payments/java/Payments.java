// POST /payments: a charge at a payment provider, at most once per
// Idempotency-Key, with JDBC (pgJDBC) behind PgBouncer in transaction mode.
//   1. claim the key in autocommit: the claim commits alone, and no
//      transaction stays open across the provider call;
//   2. checkpoint 'provider-call', extending the lease past the call's timeout;
//   3. call the provider outside any transaction, the key as its payment id;
//   4. complete with the payment row in one transaction (201), fail on a
//      refusal (4xx: saved and replayed), or mark unknown when no answer
//      tells (202);
//   5. a reconciler thread in every instance settles the unknown payments by
//      asking the provider.
// Environment: IDEM_DSN (libpq), PROVIDER_URL, PORT, PROVIDER_TIMEOUT
// (seconds, 5), RECONCILE_AFTER (30), RECONCILE_EVERY (10).  Table:
// ../schema.sql.  With Debian's libpostgresql-jdbc-java and libjackson2-databind-java:
//   CP=$(printf /usr/share/java/%s.jar: postgresql jackson-databind jackson-core jackson-annotations)
//   javac -cp $CP Payments.java && java -cp $CP. Payments
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.*;
import java.util.*;
import java.util.concurrent.*;
import java.util.regex.Pattern;

public class Payments {
    static final double PROVIDER_TIMEOUT = seconds("PROVIDER_TIMEOUT", 5);
    // The lease outlasts the provider call: until it runs out a retry gets 409,
    // never a takeover that calls the provider while this call may still land.
    static final double LEASE = PROVIDER_TIMEOUT + 10;
    static final double RECONCILE_AFTER = seconds("RECONCILE_AFTER", 30);
    static final double RECONCILE_EVERY = seconds("RECONCILE_EVERY", 10);
    static final Pattern KEY = Pattern.compile("^\"([\\x20\\x21\\x23-\\x5b\\x5d-\\x7e]{1,255})\"$"); // "..."
    static final ObjectMapper JSON = new ObjectMapper();
    static final HttpClient HTTP = HttpClient.newHttpClient();
    static final String PENDING = "{\"status\": \"pending\"}";
    static final Properties DB = new Properties();
    static String jdbcUrl;

    record Answer(int status, String body, boolean replayed) {}
    record Reply(int status, JsonNode body) {}

    static double seconds(String name, double otherwise) {
        String v = System.getenv(name);
        return v == null ? otherwise : Double.parseDouble(v);
    }

    // One connection per request: PgBouncer is the pool (a pool of the
    // application's, HikariCP's, takes the same properties).
    static Connection connect() throws SQLException {
        return DriverManager.getConnection(jdbcUrl, DB);
    }

    static void exec(Connection db, String sql, Object... params) throws SQLException {
        try (PreparedStatement st = db.prepareStatement(sql)) {
            for (int i = 0; i < params.length; i++) st.setObject(i + 1, params[i]);
            st.execute();
        }
    }

    // The status and JSON body (null if none); throws when no whole answer
    // came within PROVIDER_TIMEOUT: then the charge may or may not exist.
    static Reply provider(String method, String path, Object body) throws Exception {
        HttpRequest req = HttpRequest.newBuilder(URI.create(System.getenv("PROVIDER_URL") + path))
            .header("Content-Type", "application/json")
            .method(method, body == null ? HttpRequest.BodyPublishers.noBody()
                                         : HttpRequest.BodyPublishers.ofString(JSON.writeValueAsString(body)))
            .build();
        HttpResponse<String> res = HTTP.sendAsync(req, HttpResponse.BodyHandlers.ofString())
            .get((long) (PROVIDER_TIMEOUT * 1000), TimeUnit.MILLISECONDS);     // the body too
        JsonNode parsed;
        try { parsed = JSON.readTree(res.body()); } catch (IOException e) { parsed = null; }
        return new Reply(res.statusCode(), parsed);
    }

    // The 201's body, when the provider answered with a charge.
    static ObjectNode paymentOf(String key, Reply r) {
        if ((r.status() != 200 && r.status() != 201) || r.body() == null || !r.body().path("charge_id").isTextual())
            return null;
        return JSON.createObjectNode().put("payment_id", key).put("charge_id", r.body().get("charge_id").asText())
            .put("amount", r.body().path("amount").asInt());
    }

    // The answer saved by finish (params) and the payment row commit together.
    static void save(Connection db, ObjectNode p, String finish, Object... params) throws SQLException {
        db.setAutoCommit(false);
        try {
            exec(db, finish, params);
            exec(db, "INSERT INTO charges (key, charge_id, amount) VALUES (?, ?, ?)",
                 p.get("payment_id").asText(), p.get("charge_id").asText(), p.get("amount").asInt());
            db.commit();
        } catch (SQLException e) {
            db.rollback();
            throw e;
        } finally {
            db.setAutoCommit(true);
        }
    }

    static Answer pay(String key, String body, int amount) throws SQLException {
        long token;
        try (Connection db = connect(); PreparedStatement st = db.prepareStatement(
                "SELECT outcome, token, response_code, coalesce(result, error)::text"
                + " FROM idem_claim(?, idem_request_fingerprint('POST', '/payments', ?::jsonb),"
                + "                 lease => make_interval(secs => ?), scope => 'payments')")) {
            st.setString(1, key);
            st.setString(2, body);
            st.setDouble(3, LEASE);
            ResultSet c = st.executeQuery();
            c.next();
            switch (c.getString(1)) {
                case "replay": return new Answer(c.getInt(3), c.getString(4), true);
                case "unknown": return new Answer(202, PENDING, false);       // the reconciler settles it
                case "in_progress": return error(409, "in progress");           // another request holds the lease
            }
            // new, or takeover (a lease ran out, or the reconciler found no
            // charge): charging again under the same payment id is safe, since
            // the provider answers a repeated id with its first charge
            token = c.getLong(2);
            exec(db, "SELECT idem_checkpoint(?, ?, 'provider-call', scope => 'payments',"
                     + " extend_lease => make_interval(secs => ?))", key, token, LEASE);
        }
        Reply r;
        try {   // no transaction open and no connection held meanwhile
            r = provider("POST", "/charges", Map.of("payment_id", key, "amount", amount));
        } catch (Exception e) {     // a timeout, a reset, half a body
            r = new Reply(0, null);
        }
        try (Connection db = connect()) {
            ObjectNode p = paymentOf(key, r);
            if (p != null) {
                save(db, p, "SELECT idem_complete(?, ?, ?::jsonb, 201, scope => 'payments')", key, token, p.toString());
                return new Answer(201, p.toString(), false);
            }
            if (r.status() >= 400 && r.status() < 500 && r.status() != 429) {
                // a refusal (402: declined): saved, so that a retry gets it again
                String error = r.body() != null && r.body().isObject() ? r.body().toString() : "{\"error\": \"refused\"}";
                exec(db, "SELECT idem_fail(?, ?, ?::jsonb, retryable => false, scope => 'payments', response_code => ?)",
                     key, token, error, r.status());
                return new Answer(r.status(), error, false);
            }
            // no answer, a 5xx or 429, a body that is no charge: it may have charged
            exec(db, "SELECT idem_mark_unknown(?, ?, ?::jsonb, scope => 'payments')",
                 key, token, "{\"provider_status\": " + r.status() + "}");
            return new Answer(202, PENDING, false);
        }
    }

    // Settles the unknown payments older than RECONCILE_AFTER (a POST that
    // timed out may land late) from the provider's records.  Every instance
    // runs it: a second idem_resolve of a key waits for the first's
    // transaction, then gets IK003 (so save runs it before the INSERT).
    static void reconcile() throws SQLException {
        List<String> keys = new ArrayList<>();
        try (Connection db = connect(); PreparedStatement st = db.prepareStatement(
                "SELECT key FROM idempotency_records WHERE scope = 'payments' AND status = 'unknown'"
                + " AND recovery_point = 'provider-call' AND updated_at < now() - make_interval(secs => ?)")) {
            st.setDouble(1, RECONCILE_AFTER);
            ResultSet rs = st.executeQuery();
            while (rs.next()) keys.add(rs.getString(1));
        }
        for (String key : keys) {
            Reply r;
            try {
                r = provider("GET", "/charges/" + URLEncoder.encode(key, StandardCharsets.UTF_8).replace("+", "%20"), null);
            } catch (Exception e) {
                continue;                   // ask again next time
            }
            ObjectNode p = paymentOf(key, r);
            try (Connection db = connect()) {
                if (p != null)              // it happened: save the answer, and it
                    save(db, p, "SELECT idem_resolve(?, 'succeeded', ?::jsonb, 201, 'payments')", key, p.toString());
                else if (r.status() == 404) // it did not: the client's retry charges
                    exec(db, "SELECT idem_resolve(?, 'failed', '{\"error\": \"no charge\"}', scope => 'payments',"
                             + " retryable => true)", key);
                // anything else (a 5xx): left for the next run
            } catch (SQLException e) {
                if (!"IK003".equals(e.getSQLState())) throw e;  // IK003: another instance settled it first
            }
        }
    }

    static Answer error(int status, String message) {
        return new Answer(status, JSON.createObjectNode().put("error", message).toString(), false);
    }

    static Answer serve(HttpExchange x) throws IOException {
        String body = new String(x.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
        var key = KEY.matcher(Objects.requireNonNullElse(x.getRequestHeaders().getFirst("Idempotency-Key"), ""));
        JsonNode req;
        try { req = JSON.readTree(body); } catch (IOException e) { req = null; }
        if (!key.matches() || req == null || !req.path("amount").isInt())
            return error(400, "send Idempotency-Key: \"...\" and {\"amount\": <int>}");
        try {
            return pay(key.group(1), body, req.get("amount").asInt());
        } catch (SQLException e) {
            switch (String.valueOf(e.getSQLState())) {
                case "IK001": return error(422, "Idempotency-Key reused for another request");
                case "IK002": return error(409, "superseded");  // our lease ran out, another attempt took over
                default: e.printStackTrace(); return error(500, String.valueOf(e.getSQLState()));
            }
        }
    }

    public static void main(String[] args) throws IOException {
        // IDEM_DSN is libpq's "host=... port=... dbname=... user=... password=..." (no quoted values here)
        Map<String, String> dsn = new HashMap<>();
        for (String kv : System.getenv("IDEM_DSN").trim().split("\\s+")) dsn.put(kv.split("=", 2)[0], kv.split("=", 2)[1]);
        jdbcUrl = "jdbc:postgresql://" + dsn.get("host") + ":" + dsn.getOrDefault("port", "5432") + "/" + dsn.get("dbname");
        DB.setProperty("user", dsn.get("user"));
        DB.setProperty("password", dsn.getOrDefault("password", ""));
        // PgBouncer, transaction mode: pgJDBC makes a PreparedStatement a named
        // statement of one server connection at its 5th run (prepareThreshold 5),
        // and the next transaction may get another; 0: never
        DB.setProperty("prepareThreshold", "0");
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(System.getenv("PORT"))), 64);
        server.createContext("/payments", x -> {
            Answer a = serve(x);
            x.getResponseHeaders().set("Content-Type", "application/json");
            if (a.replayed()) x.getResponseHeaders().set("Idempotent-Replayed", "true");
            if (a.status() == 409) x.getResponseHeaders().set("Retry-After", "1");
            byte[] out = a.body().getBytes(StandardCharsets.UTF_8);
            x.sendResponseHeaders(a.status(), out.length);
            try (OutputStream os = x.getResponseBody()) { os.write(out); }
        });
        server.setExecutor(Executors.newFixedThreadPool(16));
        server.start();
        long every = (long) (RECONCILE_EVERY * 1000);
        Executors.newSingleThreadScheduledExecutor().scheduleWithFixedDelay(() -> {   // one run at a time
            try { reconcile(); } catch (Exception e) { System.err.println("reconcile: " + e); }
        }, every, every, TimeUnit.MILLISECONDS);
    }
}
