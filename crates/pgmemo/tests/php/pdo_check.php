<?php
// PHP's PDO (pdo_pgsql, on libpq) against a server, through pgmemo or directly: what
// transaction pooling must keep working for PHP applications. Run by
// tests/transaction_drivers.rs:
//
//   php pdo_check.php PORT TABLE
//
// Server-side prepared statements (PDO::ATTR_EMULATE_PREPARES off): every connection names
// them pdo_stmt_00000001, pdo_stmt_00000002, ... for its own texts, and PDO drops each with a
// SQL-level `DEALLOCATE` when the statement object goes away. Also transactions committed and
// rolled back, an error inside a transaction, a connection's `SET TIME ZONE` kept for it
// alone, and the pgsql extension's pg_prepare / pg_execute. Prints "ok" or fails.

[, $port, $t] = $argv;

function connect(string $port): PDO {
    $db = new PDO("pgsql:host=127.0.0.1;port=$port;dbname=test;sslmode=disable", 'postgres', null, [
        PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
        PDO::ATTR_EMULATE_PREPARES => false,
    ]);
    return $db;
}

function check(bool $ok, string $what): void {
    if (!$ok) {
        fwrite(STDERR, "failed: $what\n");
        exit(1);
    }
}

function one(PDO $db, string $sql, array $params = []) {
    $st = $db->prepare($sql);
    $st->execute($params);
    $v = $st->fetchColumn();
    $st = null; // DEALLOCATE pdo_stmt_...
    return $v;
}

$a = connect($port);
$b = connect($port);

// The same statement names on two connections for other texts, created and dropped over and
// over (each prepare takes the next name; each drop is a DEALLOCATE).
for ($i = 0; $i < 30; $i++) {
    check(one($a, 'SELECT ?::int + 1', [$i]) == $i + 1, "a's statement $i");
    check(one($b, "SELECT 'b:' || ?::text", ["x$i"]) === "b:x$i", "b's statement $i");
}
// Statements kept and executed again, interleaved.
$pa = $a->prepare('SELECT ?::int * 2');
$pb = $b->prepare("SELECT 'kept:' || ?::text");
for ($i = 0; $i < 30; $i++) {
    $pa->execute([$i]);
    check($pa->fetchColumn() == 2 * $i, "a's kept statement $i");
    $pb->execute([$i]);
    check($pb->fetchColumn() === "kept:$i", "b's kept statement $i");
}

// Transactions.
$ins = $a->prepare("INSERT INTO $t VALUES (?, ?)");
$a->beginTransaction();
for ($i = 1; $i <= 5; $i++) {
    $ins->execute([$i, "rolled back $i"]);
}
$a->rollBack();
check(one($b, "SELECT count(*) FROM $t") == 0, 'a rollback leaves nothing');
$a->beginTransaction();
for ($i = 1; $i <= 50; $i++) {
    $ins->execute([$i, "v$i"]);
}
$a->commit();
check(one($b, "SELECT count(*) FROM $t") == 50, 'a commit is seen by others');

// An error inside a transaction: the transaction is aborted until ROLLBACK, then all is well.
$a->beginTransaction();
try {
    one($a, 'SELECT 1 / ?::int', [0]);
    check(false, 'division by zero fails');
} catch (PDOException $e) {
    check($e->getCode() === '22012', 'division by zero: ' . $e->getCode());
}
try {
    one($a, 'SELECT 1');
    check(false, 'an aborted transaction refuses statements');
} catch (PDOException $e) {
    check($e->getCode() === '25P02', 'aborted: ' . $e->getCode());
}
$a->rollBack();
check(one($a, 'SELECT v FROM ' . $t . ' WHERE id = ?', [7]) === 'v7', 'after the rollback');

// Session settings stay the connection's own.
$before = one($b, 'SHOW TimeZone');
$a->exec("SET TIME ZONE 'Asia/Tokyo'");
for ($i = 0; $i < 10; $i++) {
    check(one($a, 'SHOW TimeZone') === 'Asia/Tokyo', 'a keeps its TimeZone');
    check(one($b, 'SHOW TimeZone') === $before, 'b never gets a\'s TimeZone');
}

// The pgsql extension: named statements of the application's own choosing.
$c = pg_connect("host=127.0.0.1 port=$port dbname=test user=postgres sslmode=disable");
$d = pg_connect("host=127.0.0.1 port=$port dbname=test user=postgres sslmode=disable", PGSQL_CONNECT_FORCE_NEW);
check($c !== false && $d !== false, 'pg_connect');
pg_prepare($c, 'get', "SELECT v FROM $t WHERE id = \$1");
pg_prepare($d, 'get', 'SELECT $1::int + 100');
for ($i = 1; $i <= 20; $i++) {
    check(pg_fetch_result(pg_execute($c, 'get', [$i]), 0, 0) === "v$i", "c's get $i");
    check(pg_fetch_result(pg_execute($d, 'get', [$i]), 0, 0) === (string) ($i + 100), "d's get $i");
}
pg_query($c, 'DEALLOCATE get');
check(@pg_execute($c, 'get', [1]) === false, 'gone after DEALLOCATE');
check(pg_fetch_result(pg_execute($d, 'get', [1]), 0, 0) === '101', "d's get stays");

echo "ok\n";
