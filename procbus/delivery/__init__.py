"""Delivery: endpoint clients behind one small interface (clients; webhook, amqp), a delivery
round (dispatch), a delivery run's rounds (rounds), one delivery workflow per topic (owner), a
--sync topic's send in the publishing call (sync), and an endpoint's name resolved and checked
again when a client connects (resolution). What an endpoint may be, checked before a topic may
send to it, is procbus.core.endpoints."""
