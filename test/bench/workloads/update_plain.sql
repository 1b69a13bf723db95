\set id random(1, 10000)
UPDATE upd_plain SET status = CASE status WHEN 'A' THEN 'B' ELSE 'A' END, n = n + 1 WHERE id = :id;
