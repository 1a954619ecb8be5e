// PostgreSQL's JDBC driver (pgjdbc) against a server, through pgmemo or directly: what
// transaction pooling must keep working for Java applications. Run by
// tests/transaction_drivers.rs as a single-file program:
//
//   java -cp /usr/share/java/postgresql.jar JdbcCheck.java PORT TABLE MODE
//
// MODE `main`: server-side prepared statements from their first execution
// (prepareThreshold=1), the same statement names (S_1, S_2, ...) on several connections for
// different texts, transactions committed and rolled back, batched inserts, typed values,
// session settings, and threads sharing a small pool; prints "ok" or fails with a stack trace.
// MODE `alter`: a prepared SELECT * executed before and after another connection adds a
// column; prints what each execution got, to be compared with PostgreSQL's own transcript.
// MODE `alter-in-transaction`: the same, each execution in a transaction of its own, with
// the driver's autosave=conservative.

import java.math.BigDecimal;
import java.sql.*;
import java.time.OffsetDateTime;
import java.util.*;
import java.util.concurrent.*;

public class JdbcCheck {
    static String url;

    static Connection connect() throws SQLException {
        return DriverManager.getConnection(url);
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    public static void main(String[] args) throws Exception {
        url = "jdbc:postgresql://127.0.0.1:" + args[0]
            + "/test?user=postgres&sslmode=disable&prepareThreshold=1";
        String table = args[1];
        switch (args[2]) {
            case "main" -> {
                mainChecks(table);
                System.out.println("ok");
            }
            case "alter" -> alter(table, false);
            case "alter-in-transaction" -> alter(table, true);
            default -> throw new IllegalArgumentException(args[2]);
        }
    }

    static void mainChecks(String t) throws Exception {
        try (Connection a = connect(); Connection b = connect()) {
            sameNamesOnTwoConnections(a, b);
            transactions(a, b, t);
            batches(a, b, t);
            types(a);
            settings(a, b);
        }
        threads(t);
    }

    /** Both connections name their first statement S_1, their second S_2, for other texts. */
    static void sameNamesOnTwoConnections(Connection a, Connection b) throws SQLException {
        try (PreparedStatement pa = a.prepareStatement("SELECT ?::int + 1");
             PreparedStatement pb = b.prepareStatement("SELECT 'b:' || ?::text");
             PreparedStatement qa = a.prepareStatement("SELECT 'a:' || ?::text");
             PreparedStatement qb = b.prepareStatement("SELECT ?::int * 10")) {
            for (int i = 0; i < 20; i++) {
                pa.setInt(1, i);
                check(single(pa).equals(String.valueOf(i + 1)), "a's S_1");
                pb.setString(1, "x" + i);
                check(single(pb).equals("b:x" + i), "b's S_1");
                qa.setString(1, "y" + i);
                check(single(qa).equals("a:y" + i), "a's S_2");
                qb.setInt(1, i);
                check(single(qb).equals(String.valueOf(i * 10)), "b's S_2");
            }
        }
    }

    static void transactions(Connection a, Connection b, String t) throws SQLException {
        a.setAutoCommit(false);
        try (PreparedStatement ins = a.prepareStatement("INSERT INTO " + t + " VALUES (?, ?)")) {
            for (int i = 1; i <= 5; i++) {
                ins.setInt(1, i);
                ins.setString(2, "rolled back " + i);
                check(ins.executeUpdate() == 1, "insert");
            }
            a.rollback();
            check(count(b, t).equals("0"), "a rollback leaves nothing");
            for (int i = 1; i <= 5; i++) {
                ins.setInt(1, i);
                ins.setString(2, "v" + i);
                ins.executeUpdate();
            }
            a.commit();
        }
        a.setAutoCommit(true);
        check(count(b, t).equals("5"), "a commit is seen by others");
    }

    static void batches(Connection a, Connection b, String t) throws SQLException {
        a.setAutoCommit(false);
        try (PreparedStatement ins = a.prepareStatement("INSERT INTO " + t + " VALUES (?, ?)")) {
            for (int i = 6; i <= 105; i++) {
                ins.setInt(1, i);
                ins.setString(2, "v" + i);
                ins.addBatch();
            }
            int[] counts = ins.executeBatch();
            check(counts.length == 100, "one count per row");
            a.commit();
        }
        a.setAutoCommit(true);
        check(count(b, t).equals("105"), "the batch is committed");
    }

    static void types(Connection a) throws SQLException {
        try (PreparedStatement p = a.prepareStatement(
                "SELECT ?::timestamptz, ?::numeric, ?::bytea, ?::int[], ?::text IS NULL")) {
            for (int i = 0; i < 5; i++) {
                OffsetDateTime ts = OffsetDateTime.parse("2026-01-02T03:04:05.123456Z");
                p.setObject(1, ts);
                p.setBigDecimal(2, new BigDecimal("12345678901234567890.0123456789"));
                p.setBytes(3, new byte[] {0, 1, 2, (byte) 255});
                p.setArray(4, a.createArrayOf("int4", new Integer[] {1, 2, 3}));
                p.setNull(5, Types.VARCHAR);
                try (ResultSet rs = p.executeQuery()) {
                    check(rs.next(), "a row");
                    check(rs.getObject(1, OffsetDateTime.class).toInstant().equals(ts.toInstant()),
                        "timestamptz");
                    check(rs.getBigDecimal(2).equals(new BigDecimal("12345678901234567890.0123456789")),
                        "numeric");
                    check(Arrays.equals(rs.getBytes(3), new byte[] {0, 1, 2, (byte) 255}), "bytea");
                    check(Arrays.equals((Integer[]) rs.getArray(4).getArray(), new Integer[] {1, 2, 3}),
                        "int[]");
                    check(rs.getBoolean(5), "null parameter");
                }
            }
        }
    }

    /** A's SET stays A's, wherever its next transaction runs; B never sees it. */
    static void settings(Connection a, Connection b) throws SQLException {
        String before = show(b, "TimeZone");
        try (Statement s = a.createStatement()) {
            s.execute("SET TIME ZONE 'Asia/Tokyo'");
        }
        for (int i = 0; i < 10; i++) {
            check(show(a, "TimeZone").equals("Asia/Tokyo"), "A keeps its TimeZone");
            check(show(b, "TimeZone").equals(before), "B never gets A's TimeZone");
        }
    }

    /** Connections over a small pool, each checking its own answers. */
    static void threads(String t) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(8);
        List<Future<?>> runs = new ArrayList<>();
        for (int n = 0; n < 8; n++) {
            final int me = n;
            runs.add(pool.submit(() -> {
                try (Connection c = connect();
                     PreparedStatement get = c.prepareStatement("SELECT v FROM " + t + " WHERE id = ?");
                     PreparedStatement mine = c.prepareStatement("SELECT ?::int + " + me)) {
                    Random r = new Random(me);
                    for (int i = 0; i < 200; i++) {
                        int id = 1 + r.nextInt(105);
                        get.setInt(1, id);
                        check(single(get).equals("v" + id), "row " + id);
                        mine.setInt(1, i);
                        check(single(mine).equals(String.valueOf(i + me)), "own statement");
                        if (i % 20 == 0) {
                            c.setAutoCommit(false);
                            try (Statement s = c.createStatement()) {
                                s.executeUpdate("UPDATE " + t + " SET v = 'tmp' WHERE id = " + id);
                            }
                            c.rollback();
                            c.setAutoCommit(true);
                        }
                    }
                }
                return null;
            }));
        }
        for (Future<?> f : runs) {
            f.get(60, TimeUnit.SECONDS);
        }
        pool.shutdown();
    }

    /**
     * A prepared SELECT * run before and after another connection adds a column. With
     * `inTransaction`, each run is a transaction of its own and the driver's
     * `autosave=conservative` (a savepoint before each statement, rolled back to and the
     * statement prepared again after `cached plan must not change result type`) heals it.
     */
    static void alter(String t, boolean inTransaction) throws SQLException {
        String saved = url;
        if (inTransaction) {
            url = url + "&autosave=conservative";
        }
        try (Connection a = connect(); Connection b = connect();
             PreparedStatement p = a.prepareStatement("SELECT * FROM " + t + " WHERE id = ?")) {
            url = saved;
            a.setAutoCommit(!inTransaction);
            p.setInt(1, 1);
            System.out.println("before: " + row(p));
            if (inTransaction) {
                a.commit();
            }
            try (Statement s = b.createStatement()) {
                s.execute("ALTER TABLE " + t + " ADD COLUMN extra int DEFAULT 7");
            }
            for (int i = 1; i <= 3; i++) {
                try {
                    System.out.println("after " + i + ": " + row(p));
                    if (inTransaction) {
                        a.commit();
                    }
                } catch (SQLException e) {
                    System.out.println("after " + i + ": error " + e.getSQLState());
                    if (inTransaction) {
                        a.rollback();
                    }
                }
            }
        }
    }

    static String row(PreparedStatement p) throws SQLException {
        try (ResultSet rs = p.executeQuery()) {
            StringBuilder out = new StringBuilder();
            ResultSetMetaData md = rs.getMetaData();
            while (rs.next()) {
                for (int i = 1; i <= md.getColumnCount(); i++) {
                    out.append(md.getColumnName(i)).append('=').append(rs.getString(i)).append(' ');
                }
            }
            return out.toString().trim();
        }
    }

    static String single(PreparedStatement p) throws SQLException {
        try (ResultSet rs = p.executeQuery()) {
            check(rs.next(), "one row");
            String v = rs.getString(1);
            check(!rs.next(), "only one row");
            return v;
        }
    }

    static String count(Connection c, String t) throws SQLException {
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT count(*) FROM " + t)) {
            rs.next();
            return rs.getString(1);
        }
    }

    static String show(Connection c, String name) throws SQLException {
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SHOW " + name)) {
            rs.next();
            return rs.getString(1);
        }
    }
}
