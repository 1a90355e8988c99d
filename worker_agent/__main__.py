from worker_agent.main import main

raise SystemExit(main())
